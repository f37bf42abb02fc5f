"""Requests are checked once, where they are parsed, against their shape and the server's rules."""

import json

import pytest

from serving.schemas import ChatCompletionRequest, CompletionRequest, RequestError, ServerRules, parse_request

RULES = ServerRules(model_id="m", vocab_size=10, max_tokens_cap=50, default_max_tokens=80)


def parse(schema, **fields):
    return parse_request(json.dumps(fields).encode(), schema, RULES)


def refusal(schema, **fields) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse(schema, **fields)
    return info.value


TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression":"1+1"}'}}
ASK = {"role": "user", "content": "What is 1+1?"}
CALLED = {"role": "assistant", "content": None, "tool_calls": [CALL]}
ANSWERED = {"role": "tool", "tool_call_id": "call_1", "content": "2"}


CHAT = {"model": "m", "messages": [ASK]}


@pytest.mark.parametrize("schema, fields, status, param, fragment", [
    (CompletionRequest, {"model": "gpt-4", "prompt": "a"}, 404, "model", "does not exist"),
    (CompletionRequest, {"model": "m", "prompt": "a", "max_tokens": 51}, 400, "max_tokens", "at most 50"),
    (ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}],
                             "max_completion_tokens": 51}, 400, "max_tokens", "at most 50"),
    (CompletionRequest, {"model": "m", "prompt": "a", "stop": ["a", ""]}, 400, "stop", "non-empty"),
    (CompletionRequest, {"model": "m", "prompt": "a", "stop": list("abcde")}, 400, "stop", "up to 4"),
    (CompletionRequest, {"model": "m", "prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
    (CompletionRequest, {"model": "m", "prompt": []}, 400, "prompt", "empty list of token ids"),
    (CompletionRequest, {"model": "m", "prompt": [3, 10]}, 400, "prompt", "token id 10, outside"),
    (CompletionRequest, {"model": "m", "prompt": "a", "echo": True, "logprobs": 1, "stream": True}, 400, "echo",
     "answered whole"),
    (ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 1},
     400, "top_logprobs", "needs logprobs: true"),
    # What pydantic refuses, in the config's formatter (common.config.describe) and OpenAI's words.
    (CompletionRequest, {"model": "m", "prompt": "a", "logit_bias": {}}, 400, "logit_bias",
     "unrecognized request argument: logit_bias; this server does not implement it"),
    (CompletionRequest, {"model": "m"}, 400, "prompt", "missing required field: prompt"),
    (CompletionRequest, {"model": "m", "prompt": "a", "temperature": -0.5}, 400, "temperature",
     "temperature must be greater than or equal to 0, got -0.5"),
    (CompletionRequest, {"model": "m", "prompt": "a", "n": 2}, 400, "n", "n must be 1, got 2"),
    (CompletionRequest, {"model": "m", "prompt": "a", "logprobs": 6}, 400, "logprobs", "logprobs"),
    (CompletionRequest, {"model": "m", "prompt": [[1, 2], [3]]}, 400, "prompt", "one prompt per request"),
    (ChatCompletionRequest, {**CHAT, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", "top_logprobs"),
    # OpenAI's tools protocol
    *[(ChatCompletionRequest, {**CHAT, **fields}, 400, param, fragment) for fields, param, fragment in [
        ({"tool_choice": "auto"}, "tool_choice", "tool_choice is only allowed when tools are specified"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}}, "tool_choice",
         "names 'x', which is not among tools (calculator)"),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "tool_choice must be none, auto, required or"),
        ({"tools": [TOOL, TOOL]}, "tools", "two functions named 'calculator'"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name", "a name is 1 to 64"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools.0.type", "tools.0.type"),
        ({"tools": [TOOL] * 129}, "tools", "tools"),
        ({"tools": [TOOL], "logprobs": True}, "logprobs", "not supported with tools"),
        ({"messages": [ASK, ANSWERED]}, "messages.1.tool_call_id", "answers no call"),
        ({"messages": [ASK, CALLED]}, "messages", "no answer to call_1"),
        ({"messages": [ASK, CALLED, ASK]}, "messages.1", "no answer to call_1"),
        ({"messages": [ASK, CALLED, {"role": "tool", "content": "2"}]}, "messages.2.tool_call_id",
         "needs the tool_call_id"),
        ({"messages": [ASK, CALLED, {**ANSWERED, "tool_call_id": "call_9"}]}, "messages.2.tool_call_id",
         "'call_9' answers no"),
        ({"messages": [{**ASK, "tool_calls": [CALL]}, ANSWERED]}, "messages.0.tool_calls", "only an assistant"),
        ({"messages": [{"role": "user", "content": None}]}, "messages.0.content", "content is missing"),
        ({"messages": [ASK, {**CALLED, "refusal": "no"}, ANSWERED]}, "messages.1.refusal", "messages.1.refusal"),
    ]],
])
def test_every_rule_is_a_refusal_naming_its_field_and_status(schema, fields, status, param, fragment):
    error = refusal(schema, **fields)
    assert (error.status, error.param) == (status, param) and fragment in str(error), (error.param, str(error))
    assert "\n" not in str(error)


def chat(**fields) -> ChatCompletionRequest:
    return parse(ChatCompletionRequest, model="m", **{"messages": [ASK], **fields})


def test_requests_are_normalised_as_openai_defines_them():
    assert chat().choice == "none" and not chat().may_call
    assert chat(tools=[TOOL]).choice == "auto" and chat(tools=[TOOL]).may_call
    assert chat(tools=[TOOL], tool_choice="none").may_call is False
    assert chat(tools=[TOOL], tool_choice="required").choice == "required"
    named = chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "calculator"}})
    assert named.choice == "calculator" and named.tool_names == ("calculator",)
    # A call and its result are taken as the openai client sends them back (its empty fields too).
    # The assistant message as the openai client sends back the one it received (its empty fields too).
    echoed = {**CALLED, "refusal": None, "annotations": None, "audio": None, "function_call": None}
    request = chat(messages=[ASK, echoed, ANSWERED], tools=[TOOL])
    assert request.messages[1].tool_calls[0].function.arguments == '{"expression":"1+1"}'
    assert request.messages[2].tool_call_id == "call_1"
    # A batch of one becomes its prompt, and max_tokens is resolved.
    assert parse(CompletionRequest, model="m", prompt=["hi"]).prompt == "hi"
    assert parse(CompletionRequest, model="m", prompt=[[1, 2]]).prompt == [1, 2]
    assert parse(CompletionRequest, model="m", prompt="a").max_new_tokens == 50  # the default, capped
    newer = parse(ChatCompletionRequest, model="m", messages=[{"role": "user", "content": "x"}], max_tokens=9,
                 max_completion_tokens=7)
    assert newer.max_new_tokens == 7  # OpenAI's newer name wins
