"""A conversation far past a 128-token window is answered at every turn on every surface."""

import os
import subprocess
import sys

import openai
import pytest

from data.chat import Message, fit_for_reply
from data.tokenizer import load_tokenizer
from run_testkit import build_run, chat_tokenizer
from server_process import ROOT, running_server
from test_chat_page import Page, _browser

pytestmark = pytest.mark.e2e

BLOCK_SIZE = 128
SYSTEM = "You are HAMLET in Hamlet."
# Twelve user turns of a dozen tokens or so: with the replies, several windows' worth.
TURNS = [f"Turn {i}: what news from Elsinore, and who keeps the watch tonight?" for i in range(12)]
SETTINGS = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 24, "seed": 5}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("runs") / "chat-128", chat_tokenizer(), block_size=BLOCK_SIZE)


@pytest.fixture(scope="module")
def server(run_dir):
    with running_server(run_dir, "--max-batch", "2") as served:
        yield served.base


def test_the_openai_client_gets_a_reply_at_every_turn_and_learns_what_was_dropped(server, run_dir):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=60)
    tokenizer = load_tokenizer(run_dir / "tokenizer.json")
    messages = [{"role": "system", "content": SYSTEM}]
    dropped = []
    for text in TURNS:  # the client resends the whole conversation every turn, as OpenAI clients do
        messages.append({"role": "user", "content": text})
        raw = client.chat.completions.with_raw_response.create(model="chat-128", messages=messages, **SETTINGS)
        reply = raw.parse()
        choice = reply.choices[0]
        assert choice.finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1
        assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= BLOCK_SIZE
        dropped.append(int(raw.headers["X-Dropped-Messages"]))
        # The server cut exactly as the chat format's policy does.
        fitted = fit_for_reply(tokenizer, [Message(m["role"], m["content"]) for m in messages], BLOCK_SIZE)
        assert (dropped[-1], reply.usage.prompt_tokens) == (fitted.dropped, len(fitted.chat.ids))
        messages.append({"role": "assistant", "content": choice.message.content})
    assert dropped[0] == 0 and dropped[-1] >= 10  # the oldest went, more of them as the chat grew
    assert dropped == sorted(dropped) and dropped[-1] % 2 == 0  # whole exchanges, from a user message on
    streamed = client.chat.completions.with_raw_response.create(model="chat-128", messages=messages[:-1],
                                                                stream=True, **SETTINGS)
    assert int(streamed.headers["X-Dropped-Messages"]) == dropped[-1]
    assert "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices) == messages[-1]["content"]


def test_a_single_message_longer_than_the_window_is_refused_in_one_line(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="chat-128", messages=[{"role": "user", "content": "word " * 200}])
    error = refused.value.body
    assert error["code"] == "context_length_exceeded" and "shorten it" in error["message"]
    assert "\n" not in error["message"]
    # More characters than any window could hold: refused before a token is made, naming the field.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="chat-128", messages=[{"role": "user", "content": "word " * 40000}])
    assert refused.value.body["message"].startswith("messages: 200000 characters, more than this model's context")


def test_the_page_answers_every_turn_and_notes_the_dropped_messages(server):
    browser = _browser()
    try:
        page = Page(browser, server)
        page.fill("system", SYSTEM)
        page.settings(**SETTINGS)
        for turn, text in enumerate(TURNS):
            page.send(text)
            page.wait_for(lambda: page.state() == "idle" and len(page.texts(".assistant .text")) == turn + 1,
                          f"the reply to turn {turn}")
        assert page.error() == "" and page.texts(".user .text") == TURNS
        notes = page.texts(".note")
        assert notes and all("fit the model's context and were left out (the system prompt is kept)" in n
                             for n in notes)
        # The page sends only what the model still sees: what it kept fits the window.
        kept = browser.execute_script("return page.messages")
        assert 2 <= len(kept) < 2 * len(TURNS) and kept[-2]["content"] == TURNS[-1]
    finally:
        browser.quit()


def test_the_repl_answers_every_turn_and_says_when_it_dropped_messages(run_dir):
    proc = subprocess.run(
        [sys.executable, "generate.py", "--run", str(run_dir), "--chat", "--system", SYSTEM, "--temperature", "0.8",
         "--seed", "5", "--max-new-tokens", "24"],
        input="".join(f"{text}\n" for text in TURNS), capture_output=True, text=True, timeout=300, cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"))
    assert proc.returncode == 0 and "error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    notices = [line for line in proc.stderr.splitlines() if "oldest message(s) were dropped" in line]
    assert len(notices) >= 2
    assert proc.stdout.count("\n") >= len(TURNS)  # a reply line per turn (a reply may hold newlines too)
