"""Requests are checked once, where they are parsed: against their shape and the server's rules.

No server here: what the routes receive from ``parse_request`` is already checked (the HTTP tests
in test_server.py and test_logprobs.py see the same refusals through a socket).
"""

from __future__ import annotations

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


def test_a_batch_of_one_becomes_its_prompt_and_max_tokens_is_resolved():
    assert parse(CompletionRequest, model="m", prompt=["hi"]).prompt == "hi"
    assert parse(CompletionRequest, model="m", prompt=[[1, 2]]).prompt == [1, 2]
    assert parse(CompletionRequest, model="m", prompt="a").max_new_tokens == 50  # the default, capped
    chat = parse(ChatCompletionRequest, model="m", messages=[{"role": "user", "content": "x"}], max_tokens=9,
                 max_completion_tokens=7)
    assert chat.max_new_tokens == 7  # OpenAI's newer name wins


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
])
def test_every_rule_is_a_refusal_naming_its_field_and_status(schema, fields, status, param, fragment):
    error = refusal(schema, **fields)
    assert (error.status, error.param) == (status, param) and fragment in str(error)
    assert "\n" not in str(error)
