"""OpenAI's tools protocol through the openai client, against a run that really calls the calculator."""

import contextlib
import io
import json
import re

import httpx
import pytest

from server_process import ROOT, running_server
from tools import BUILT_IN
from tools.calculator import calculator

openai = pytest.importorskip("openai")

MODEL = "tiny-tools"
CALCULATOR = BUILT_IN["calculator"].schema()
WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def served(tool_run_dir):
    with running_server(tool_run_dir, "--max-batch", "2") as served:
        yield served


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0, timeout=60)


def ask(client, question: str, **options):
    options = {"tools": [CALCULATOR], "max_tokens": 60, **options}
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          temperature=0, **options)


def run_call(call) -> str:
    """The client's side of the loop: run the calculator the model asked for."""
    assert call.function.name == "calculator"
    return calculator(**json.loads(call.function.arguments))


def test_the_full_loop_a_call_the_clients_result_and_the_answer_and_the_docs_loop_as_written(client, served):
    question = {"role": "user", "content": "What is 12*34?"}
    choice = ask(client, question["content"]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, call.function.arguments) == ("calculator", '{"expression":"12*34"}')
    # The client runs the tool and answers with a tool message; the assistant message goes back as
    # the client received it (the openai object itself).
    result = {"role": "tool", "tool_call_id": call.id, "content": run_call(call)}
    second = client.chat.completions.create(model=MODEL, messages=[question, choice.message, result],
                                            tools=[CALCULATOR], temperature=0, max_tokens=60)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "408" and not second.choices[0].message.tool_calls
    # docs/serving.md's loop, only its address and question changed: it calls, sends the result, prints the answer.
    section = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8").split("## Tools")[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert "http://127.0.0.1:8000/v1" in snippet and "What is 347*812?" in snippet
    snippet = snippet.replace("http://127.0.0.1:8000/v1", f"{served.base}/v1").replace("347*812", "12*34")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet, {})
    assert printed.getvalue() == "408\n"


def _streamed(client, messages, **options) -> tuple[str, list[dict], str]:
    """(content, tool calls, finish reason) from a stream, accumulated as clients do."""
    content, calls, finish = "", {}, None
    options = {"max_tokens": 60, **options}
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, temperature=0, stream=True,
                                                **options):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or ():
            entry = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = piece.id or entry["id"]
            if piece.function is not None:
                entry["name"] += piece.function.name or ""
                entry["arguments"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_the_full_loop_streamed(client):
    question = {"role": "user", "content": "What is 99-45?"}
    content, calls, finish = _streamed(client, [question], tools=[CALCULATOR])
    assert (content, finish) == ("", "tool_calls")
    [call] = calls
    assert call["id"].startswith("call_") and (call["name"], call["arguments"]) == ("calculator", '{"expression":"99-45"}')
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": calculator("99-45")}
    content, calls, finish = _streamed(client, [question, assistant, result], tools=[CALCULATOR])
    assert (content, calls, finish) == ("54", [], "stop")


def test_tool_choice_required_and_named_force_a_call_and_none_never_calls(client):
    # Required: the model calls, as it would have; named: the function forced, among two offered.
    required = ask(client, "What is 7+8?", tool_choice="required").choices[0]
    assert required.finish_reason == "tool_calls" and required.message.tool_calls[0].function.name == "calculator"
    named = ask(client, "What is 12*34?", tools=[WEATHER, CALCULATOR],
                tool_choice={"type": "function", "function": {"name": "calculator"}}).choices[0]
    assert named.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in named.message.tool_calls] == \
           [("calculator", '{"expression":"12*34"}')]
    # Forcing a function the model never learned: whatever it writes after the name is a weather
    # call if it parses, and text (beginning with the forced call) if not.
    forced = ask(client, "What is 12*34?", tools=[WEATHER, CALCULATOR],
                 tool_choice={"type": "function", "function": {"name": "weather"}}).choices[0]
    if forced.finish_reason == "tool_calls":
        assert {c.function.name for c in forced.message.tool_calls} == {"weather"}
    else:
        assert forced.message.content.startswith("<|call|>weather")
    # None, and no tools, never call.
    for options in ({"tool_choice": "none"}, {"tools": openai.NOT_GIVEN}):
        choice = ask(client, "What is 12*34?", **options).choices[0]
        assert not choice.message.tool_calls and choice.finish_reason in ("stop", "length")
        assert "<|call|>" not in choice.message.content
    # The protocol's other mistakes are refused where requests are parsed: test_schemas.py's table.
    call = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": "[1]"}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    with pytest.raises(openai.BadRequestError, match="not an object"):
        client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR], max_tokens=5)
    assert ask(client, "What is 7+8?").choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("question, options, reason", [
    ("What is 5*5?", {}, "stop"),  # a call the model gets wrong: its arguments are not JSON
    ("What is 12*34?", {"tools": [WEATHER]}, "stop"),  # a call to a function not offered
    ("What is 12*34?", {"max_tokens": 6}, "length"),  # a call cut short
    ("What is 12*34?", {"stop": ["expr"]}, "stop"),  # a call cut by a stop string
])
def test_a_call_that_cannot_be_used_reaches_the_client_as_text(client, question, options, reason):
    choice = ask(client, question, **options).choices[0]
    assert choice.finish_reason == reason and not choice.message.tool_calls
    assert choice.message.content.startswith("<|call|>")
    content, calls, finish = _streamed(client, [{"role": "user", "content": question}],
                                       **{"tools": [CALCULATOR], **options})
    assert (content, calls, finish) == (choice.message.content, [], reason)


def test_the_stream_carries_openais_chunk_shapes_and_the_whole_replys_call(served, client):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is 7+8?"}], "tools": [CALCULATOR],
            "temperature": 0, "max_tokens": 60, "stream": True}
    with httpx.stream("POST", f"{served.base}/v1/chat/completions", json=body, timeout=60) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [(json.loads(e)["choices"][0]["delta"], json.loads(e)["choices"][0]["finish_reason"]) for e in events[:-1]]
    assert deltas[0] == ({"role": "assistant", "content": ""}, None)
    [opening] = deltas[1][0]["tool_calls"]
    assert opening == {"index": 0, "id": opening["id"], "type": "function",
                       "function": {"name": "calculator", "arguments": ""}}
    assert deltas[2] == ({"tool_calls": [{"index": 0, "function": {"arguments": '{"expression":"7+8"}'}}]}, None)
    assert deltas[3] == ({}, "tool_calls") and len(deltas) == 4
    whole = ask(client, "What is 7+8?").choices[0]  # the same question whole: the same call
    assert whole.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [
        ("calculator", '{"expression":"7+8"}')]


def test_a_run_from_before_tool_calls_chats_and_refuses_tools_in_one_line(tmp_path):
    from run_testkit import build_run, chat_tokenizer_before_tools

    run = build_run(tmp_path / "old-chat", chat_tokenizer_before_tools())
    with running_server(run) as served:
        old = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0, timeout=60)
        plain = old.chat.completions.create(model="old-chat", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=3, temperature=0)
        assert plain.choices[0].message.content is not None
        for request in ({"tools": [CALCULATOR]},
                        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None,
                                                                           "tool_calls": [{"id": "c", "type": "function",
                                      "function": {"name": "calculator", "arguments": "{}"}}]},
                                      {"role": "tool", "tool_call_id": "c", "content": "2"}]}):
            with pytest.raises(openai.BadRequestError, match=r"this run's tokenizer has no tool tokens") as info:
                old.chat.completions.create(model="old-chat", **{"messages": [{"role": "user", "content": "hi"}],
                                                                 **request}, max_tokens=3)
            assert info.value.status_code == 400 and "\n" not in info.value.body["message"]
