"""The chat page at GET /, driven in headless Chromium against a real serve.py on 127.0.0.1. Needs
``chromium``, ``chromium-driver`` and ``selenium`` (else skips); ``CHAT_PAGE_SCREENSHOT=docs/chat-page.png``
keeps the README's screenshot. And a conversation far past a 128-token window is answered at every turn
on every surface: the page, the OpenAI client and generate.py's REPL."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from data.chat import END_OF_TURN, Message, fit_for_reply
from data.tokenizer import EOT, load_tokenizer
from run_testkit import build_run, chat_tokenizer
from server_process import ROOT, running_server

pytestmark = pytest.mark.e2e

# The server's --max-tokens-cap. A reply this long runs for minutes, so it is still running when
# Stop is pressed, and a stream asking for it keeps the one row busy however slowly the browser
# acts on a loaded machine (a shorter one could end first, and the page would then be served).
CAP = 1_000_000
SYSTEM = "You are HAMLET in Hamlet."
TURNS = ["Who's there?", "Stand, and unfold yourself."]


def _browser():
    """Headless Chromium through selenium, or a skip that names what is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip("the chat page's browser tests need Chromium and its driver "
                    "(Debian: apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser tests need selenium "
                                    "(pip install -r requirements-dev.txt)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    # No sandbox: Chromium refuses to start its sandbox as root, which CI containers often are.
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,760"):
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=chromedriver)
    return webdriver.Chrome(options=options, service=service)


@pytest.fixture(scope="module")
def browser():
    driver = _browser()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # A context long enough for a system prompt and two turns, and a model that never ends a reply
    # by itself, so that Stop always meets a running request. One row and no queue: a second
    # request while one runs is refused with 503, and a row the page's Stop did not free would
    # refuse the next request too.
    yield from _one_row_server(tmp_path_factory, block_size=256)


@pytest.fixture(scope="module")
def long_server(tmp_path_factory):
    # The same with a window eight times longer: a reply that runs to the window takes seconds, so
    # Stop always lands mid-reply however fast the decoder is.
    yield from _one_row_server(tmp_path_factory, block_size=2048)


def _one_row_server(tmp_path_factory, block_size: int):
    run_dir = build_run(tmp_path_factory.mktemp("runs") / "tiny-chat", chat_tokenizer(), block_size=block_size,
                        never_predicts=(END_OF_TURN, EOT))
    with running_server(run_dir, "--max-batch", "1", "--max-queue", "0",
                        "--max-tokens-cap", str(CAP)) as server:
        yield server.base


class Page:
    """The page's controls by their ids, and waits on the state it shows in ``body[data-state]``."""

    def __init__(self, driver, base: str) -> None:
        from selenium.webdriver.common.by import By

        self.driver, self.by = driver, By
        driver.get(base + "/")
        self.wait_for(lambda: self.state() == "idle", "the page to load")

    def field(self, element_id: str):
        return self.driver.find_element(self.by.ID, element_id)

    def fill(self, element_id: str, value: object) -> None:
        element = self.field(element_id)
        element.clear()
        element.send_keys(str(value))

    def settings(self, **values: object) -> None:
        for element_id, value in values.items():
            self.fill(element_id.replace("_", "-"), value)

    def send(self, text: str) -> None:
        self.fill("input", text)
        self.field("send").click()

    def state(self) -> str:
        return self.driver.find_element(self.by.TAG_NAME, "body").get_attribute("data-state")

    def texts(self, selector: str) -> list[str]:
        # textContent, exactly as the page holds it (WebElement.text would normalise whitespace).
        return self.driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)", selector)

    def error(self) -> str:
        return self.field("error").get_attribute("textContent")

    def wait_for(self, condition, what: str, *, error_expected: bool = False, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if (not error_expected and self.error()) or time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the page shows {self.error()!r} in state "
                                     f"{self.state()!r}, with {len(self.texts('.msg'))} messages")
            time.sleep(0.05)


def _api(base: str, path: str, body: dict) -> dict:
    response = httpx.post(f"{base}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _health(base: str) -> dict:
    return httpx.get(f"{base}/health", timeout=5).json()


def _active(base: str) -> int:
    health = _health(base)
    return health["active"] + health["waiting"]


def test_the_page_is_one_file_that_calls_only_its_own_server(server):
    response = httpx.get(f"{server}/", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    # No script, style sheet, image or font from anywhere, and no address of another host.
    assert not re.search(r"\b(src|href)\s*=|@import|url\(", response.text)
    assert "://" not in response.text


def test_the_streamed_chat_equals_the_api_for_the_same_seed(browser, server, tmp_path):
    page = Page(browser, server)
    page.fill("system", SYSTEM)
    page.settings(temperature=0.8, top_p=0.9, max_tokens=40, seed=7)
    settings = {"temperature": 0.8, "top_p": 0.9, "max_tokens": 40, "seed": 7}
    messages = [{"role": "system", "content": SYSTEM}]
    for turn, text in enumerate(TURNS):
        page.send(text)
        page.wait_for(lambda: page.state() == "idle" and len(page.texts(".assistant .text")) == turn + 1,
                      "the reply")
        # The page resends the whole conversation each turn, as an OpenAI client does.
        messages.append({"role": "user", "content": text})
        reply = _api(server, "/v1/chat/completions", {"model": "tiny-chat", "messages": messages, **settings})
        messages.append(reply["choices"][0]["message"])
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert page.texts(".assistant .text") == replies
    assert all(replies) and page.error() == ""
    assert page.texts(".user .text") == TURNS

    shot = tmp_path / "chat-page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    if os.environ.get("CHAT_PAGE_SCREENSHOT"):
        target = Path(os.environ["CHAT_PAGE_SCREENSHOT"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)

    page.field("new").click()
    assert page.texts(".msg") == []


def test_stop_cancels_the_reply_and_the_server_frees_the_row(browser, long_server):
    server = long_server
    page = Page(browser, server)
    page.settings(temperature=0, max_tokens=CAP)
    page.send("Speak, speak!")
    # Text has streamed in while the request still runs: the reply arrives piece by piece.
    page.wait_for(lambda: page.state() == "streaming" and len("".join(page.texts(".assistant .text"))) > 20,
                  "the reply to start streaming")
    assert _active(server) == 1
    partial = page.texts(".assistant .text")[0]
    page.field("stop").click()
    page.wait_for(lambda: page.state() == "idle", "the page to stop")
    deadline = time.monotonic() + 10
    while _active(server) != 0:
        assert time.monotonic() < deadline, "the server still runs the request the page stopped"
        time.sleep(0.05)
    shown = page.texts(".assistant .text")[0]
    assert shown.startswith(partial) and page.texts(".note") == ["stopped"] and page.error() == ""
    # The one row is free: the next request is served rather than refused with 503.
    assert _api(server, "/v1/completions", {"model": "tiny-chat", "prompt": "a", "max_tokens": 2})["choices"]


def test_refusals_show_as_a_readable_message(browser, server):
    page = Page(browser, server)
    page.settings(max_tokens=CAP + 1)
    page.send("Who's there?")
    page.wait_for(lambda: page.state() == "idle" and page.error() != "", "the error", error_expected=True)
    assert page.error().startswith(f"The server refused the request (400): max_tokens is {CAP + 1}")
    # The message comes back to the input box, and the conversation does not keep the failed turn.
    assert page.field("input").get_attribute("value") == "Who's there?" and page.texts(".msg") == []

    page.settings(max_tokens=20)
    # Greedy: the model's end tokens have a zero logit, which sampling can still draw (the stream
    # would then end and free the row before the page asks) but the largest logit never is.
    body = {"model": "tiny-chat", "prompt": "a", "max_tokens": CAP, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as occupying:
        assert occupying.status_code == 200
        # The stream holds the one row (admitted and decoding) before the page asks for it.
        deadline = time.monotonic() + 30
        while _health(server)["active"] != 1:
            assert time.monotonic() < deadline, "the occupying stream never took the row"
            time.sleep(0.05)
        page.field("send").click()
        try:
            page.wait_for(lambda: page.state() == "idle" and page.error() != "", "the busy message",
                          error_expected=True)
        except AssertionError as e:  # say what the server was doing, for a failure seen only under load
            raise AssertionError(f"{e}; the server's /health: {_health(server)}")
    assert page.error().startswith("The server refused the request (503): the server is busy")
    assert page.error().endswith("Try again in 1 s.")


def test_a_run_without_chat_tokens_gets_a_completion_box(browser, plain_run_dir):
    with running_server(plain_run_dir) as server:
        base = server.base
        page = Page(browser, base)
        assert "text completion" in page.field("model").text
        assert not page.field("system").is_displayed()
        page.settings(temperature=0.9, max_tokens=30, seed=3)
        page.send("ROMEO: But soft")
        page.wait_for(lambda: page.state() == "idle" and page.texts(".generated") != [""], "the completion")
        reply = _api(base, "/v1/completions", {"model": "tiny-plain", "prompt": "ROMEO: But soft",
                                               "temperature": 0.9, "max_tokens": 30, "seed": 3})
        assert page.texts(".completion .text") == ["ROMEO: But soft" + reply["choices"][0]["text"]]
        assert page.texts(".generated") == [reply["choices"][0]["text"]]

        page.settings(max_tokens=10**6)
        page.send("JULIET:")
        page.wait_for(lambda: page.state() == "idle" and page.error() != "", "the error", error_expected=True)
        assert page.error().startswith("The server refused the request (400): max_tokens is 1000000")
        assert page.field("input").get_attribute("value") == "JULIET:" and page.texts(".msg") == []


# A conversation far past a 128-token window

BLOCK_SIZE = 128
# Twelve user turns of a dozen tokens or so: with the replies, several windows' worth.
LONG_TURNS = [f"Turn {i}: what news from Elsinore, and who keeps the watch tonight?" for i in range(12)]
LONG_SETTINGS = {"temperature": 0.8, "top_p": 0.95, "max_tokens": 24, "seed": 5}


@pytest.fixture(scope="module")
def window_run_dir(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("runs") / "chat-128", chat_tokenizer(), block_size=BLOCK_SIZE)


@pytest.fixture(scope="module")
def window_server(window_run_dir):
    with running_server(window_run_dir, "--max-batch", "2") as served:
        yield served.base


def test_the_openai_client_gets_a_reply_at_every_turn_and_learns_what_was_dropped(window_server, window_run_dir):
    client = openai.OpenAI(base_url=f"{window_server}/v1", api_key="x", max_retries=0, timeout=60)
    tokenizer = load_tokenizer(window_run_dir / "tokenizer.json")
    messages = [{"role": "system", "content": SYSTEM}]
    dropped = []
    for text in LONG_TURNS:  # the client resends the whole conversation every turn, as OpenAI clients do
        messages.append({"role": "user", "content": text})
        raw = client.chat.completions.with_raw_response.create(model="chat-128", messages=messages, **LONG_SETTINGS)
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
                                                                stream=True, **LONG_SETTINGS)
    assert int(streamed.headers["X-Dropped-Messages"]) == dropped[-1]
    assert "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices) == messages[-1]["content"]


def test_a_single_message_longer_than_the_window_is_refused_in_one_line(window_server):
    client = openai.OpenAI(base_url=f"{window_server}/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="chat-128", messages=[{"role": "user", "content": "word " * 200}])
    error = refused.value.body
    assert error["code"] == "context_length_exceeded" and "shorten it" in error["message"]
    assert "\n" not in error["message"]
    # More characters than any window could hold: refused before a token is made, naming the field.
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="chat-128", messages=[{"role": "user", "content": "word " * 40000}])
    assert refused.value.body["message"].startswith("messages: 200000 characters, more than this model's context")


def test_the_page_answers_every_turn_and_notes_the_dropped_messages(window_server):
    browser = _browser()
    try:
        page = Page(browser, window_server)
        page.fill("system", SYSTEM)
        page.settings(**LONG_SETTINGS)
        for turn, text in enumerate(LONG_TURNS):
            page.send(text)
            page.wait_for(lambda: page.state() == "idle" and len(page.texts(".assistant .text")) == turn + 1,
                          f"the reply to turn {turn}")
        assert page.error() == "" and page.texts(".user .text") == LONG_TURNS
        notes = page.texts(".note")
        assert notes and all("fit the model's context and were left out (the system prompt is kept)" in n
                             for n in notes)
        # The page sends only what the model still sees: what it kept fits the window.
        kept = browser.execute_script("return page.messages")
        assert 2 <= len(kept) < 2 * len(LONG_TURNS) and kept[-2]["content"] == LONG_TURNS[-1]
    finally:
        browser.quit()


def test_the_repl_answers_every_turn_and_says_when_it_dropped_messages(window_run_dir):
    proc = subprocess.run(
        [sys.executable, "generate.py", "--run", str(window_run_dir), "--chat", "--system", SYSTEM,
         "--temperature", "0.8", "--seed", "5", "--max-new-tokens", "24"],
        input="".join(f"{text}\n" for text in LONG_TURNS), capture_output=True, text=True, timeout=300, cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"))
    assert proc.returncode == 0 and "error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    notices = [line for line in proc.stderr.splitlines() if "oldest message(s) were dropped" in line]
    assert len(notices) >= 2
    assert proc.stdout.count("\n") >= len(LONG_TURNS)  # a reply line per turn (a reply may hold newlines too)
