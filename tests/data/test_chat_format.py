"""The chat format: reserved tokens, known text and ids, loss masks token by token."""

import re

import pytest

from common.errors import DataError
from data.chat import (
    CHAT_SPECIAL_TOKENS, CHAT_TEMPLATE, END_OF_TURN, TOOL_SPECIAL_TOKENS, ChatTokenIds, ChatTooLong, Message, ToolCall,
    chat_text, encode_plain, fit_chat, parse_reply, render_chat, to_messages,
)
from data.tokenizer import EOT, new_tokenizer
from data_testkit import pre_tool_tokenizer

CONVERSATION = [
    {"role": "system", "content": "You are Hamlet."},
    {"role": "user", "content": "Who's there?"},
    {"role": "assistant", "content": "Nay, answer me."},
    {"role": "user", "content": "Long live the king!"},
    {"role": "assistant", "content": "Bernardo?"},
]


def test_every_trained_tokenizer_reserves_the_chat_tokens_after_eot_then_the_tool_tokens(tokenizer):
    assert [tokenizer.token_to_id(t) for t in (EOT, *CHAT_SPECIAL_TOKENS, *TOOL_SPECIAL_TOKENS)] == list(range(7))
    assert tokenizer.get_vocab_size() == 400
    special = ChatTokenIds.of(tokenizer)
    assert special.has_tools and special.role["tool"] == 5 and special.call == 6
    # The tool turn is never sampled, like every role; <|call|> only where tools are offered.
    assert special.suppress_ids == special.reply_suppress_ids(tools=True) == (1, 2, 3, 5)
    assert special.reply_suppress_ids(tools=False) == (1, 2, 3, 5, 6)


def test_known_messages_render_to_known_text_and_ids(tokenizer):
    messages = to_messages(CONVERSATION[:3])
    assert chat_text(messages) == ("<|system|>You are Hamlet.<|end|><|user|>Who's there?<|end|>"
                                   "<|assistant|>Nay, answer me.<|end|>")
    assert chat_text(messages[:2], add_generation_prompt=True).endswith("<|end|><|assistant|>")
    ids = render_chat(tokenizer, messages).ids
    plain = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    assert ids == [1, *plain("You are Hamlet."), 4, 2, *plain("Who's there?"), 4,
                   3, *plain("Nay, answer me."), 4]
    # The rendered text, tokenized with special tokens recognised (what transformers does with
    # the Jinja template's output), gives the same ids.
    assert tokenizer.encode(chat_text(messages), add_special_tokens=False).ids == ids
    # The generation prompt adds an assistant token that carries no loss.
    prompted = render_chat(tokenizer, messages[:2], add_generation_prompt=True)
    assert prompted.ids[-1] == ChatTokenIds.of(tokenizer).role["assistant"] and not any(prompted.loss_mask)


def test_loss_mask_covers_assistant_text_and_its_end_token_only(tokenizer):
    rendered = render_chat(tokenizer, to_messages(CONVERSATION))
    ids, mask = rendered.ids, rendered.loss_mask
    assert len(ids) == len(mask)
    special = ChatTokenIds.of(tokenizer)
    learned = [tokenizer.decode([i], skip_special_tokens=False) for i, m in zip(ids, mask) if m]
    assert "".join(learned) == "Nay, answer me.<|end|>Bernardo?<|end|>"
    # Token by token: every role token and every system/user token carries no loss.
    role = None
    for token, m in zip(ids, mask):
        if token in special.role.values():
            role = next(r for r, t in special.role.items() if t == token)
            assert not m
        else:
            assert m == (role == "assistant"), (token, role)


@pytest.mark.parametrize("text", ["<|end|>", "a<|user|>b", "<|endoftext|><|assistant|>", END_OF_TURN * 3,
                                  "<|call|>f{}<|tool|>"])
def test_plain_text_never_becomes_a_special_token(tokenizer, text):
    specials = {tokenizer.token_to_id(t) for t in (EOT, *CHAT_SPECIAL_TOKENS, *TOOL_SPECIAL_TOKENS)}
    [ids] = encode_plain(tokenizer, [text])
    assert not specials & set(ids) and tokenizer.decode(ids) == text
    rendered = render_chat(tokenizer, [Message("user", text)]).ids
    assert not specials & set(rendered[1:-1])
    assert tokenizer.encode_special_tokens is False  # the flag is restored


def test_a_tokenizer_without_chat_tokens_is_refused_with_the_fix():
    old = new_tokenizer()
    old.add_special_tokens([EOT])
    with pytest.raises(DataError, match="trained before the chat format.*pretrain a new run"):
        ChatTokenIds.of(old)


# Tool calls

TOOL_CONVERSATION = [
    {"role": "system", "content": "You can calculate."},
    {"role": "user", "content": "What is 347*812?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression":"347*812"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "281764"},
    {"role": "assistant", "content": "It is 281764."},
]


def test_a_tool_conversation_renders_to_known_text_and_ids(tokenizer):
    messages = to_messages(TOOL_CONVERSATION)
    assert messages[2] == Message("assistant", "", (ToolCall("calculator", '{"expression":"347*812"}'),))
    assert chat_text(messages[1:]) == (
        '<|user|>What is 347*812?<|end|><|assistant|><|call|>calculator{"expression":"347*812"}<|end|>'
        "<|tool|>281764<|end|><|assistant|>It is 281764.<|end|>"
    )
    ids = render_chat(tokenizer, messages[1:]).ids
    plain = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    assert ids == [2, *plain("What is 347*812?"), 4, 3, 6, *plain('calculator{"expression":"347*812"}'), 4,
                   5, *plain("281764"), 4, 3, *plain("It is 281764."), 4]
    assert tokenizer.encode(chat_text(messages), add_special_tokens=False).ids == render_chat(tokenizer, messages).ids
    assert to_messages(TOOL_CONVERSATION[1:3])[-1].tool_calls  # a call still to be run may end the conversation


def test_loss_falls_on_the_assistants_calls_and_replies_never_on_tool_results(tokenizer):
    rendered = render_chat(tokenizer, to_messages(TOOL_CONVERSATION))
    learned = [tokenizer.decode([i], skip_special_tokens=False) for i, m in zip(rendered.ids, rendered.loss_mask) if m]
    assert "".join(learned) == '<|call|>calculator{"expression":"347*812"}<|end|>It is 281764.<|end|>'
    # Token by token: the tool turn (its role token, its text and its end) carries no loss.
    special = ChatTokenIds.of(tokenizer)
    tool_start = rendered.ids.index(special.role["tool"])
    tool_end = rendered.ids.index(special.end, tool_start)
    assert not any(rendered.loss_mask[tool_start:tool_end + 1])


@pytest.mark.parametrize("conversation", [CONVERSATION, TOOL_CONVERSATION], ids=["plain", "tools"])
def test_turn_by_turn_rendering_and_the_jinja_template_give_exactly_the_whole_rendering(tokenizer, conversation):
    messages = to_messages(conversation)
    assert [i for m in messages for i in render_chat(tokenizer, [m]).ids] == render_chat(tokenizer, messages).ids
    jinja2 = pytest.importorskip("jinja2")
    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    for prompt in (False, True):
        rendered = template.render(messages=conversation, add_generation_prompt=prompt, tools=[{}],
                                   raise_exception=lambda message: None)
        assert rendered == chat_text(messages, add_generation_prompt=prompt)


def test_arguments_given_as_an_object_are_written_as_json_dumps_writes_them():
    [message] = to_messages([{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"b": "é", "a": [1, 2]}}}]}])
    assert message.tool_calls == (ToolCall("f", '{"b": "é", "a": [1, 2]}'),)


@pytest.mark.parametrize("raw, fragment", [
    ("hello", "must be a list"),
    ([{"role": "user"}], "'role' and 'content'"),
    ([{"role": "narrator", "content": "x"}], "unknown role 'narrator'"),
    ([{"role": "user", "content": 3}], "must be a string"),
    ([{"role": "tool", "content": "5"}], "answers no call"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "tool", "content": "5"}],
     "answers no call"),
    (TOOL_CONVERSATION[1:3] + [{"role": "user", "content": "and?"}], "without a result"),
    (TOOL_CONVERSATION[1:4] + [TOOL_CONVERSATION[3]], "answers no call"),
    ([{"role": "user", "content": "q", "tool_calls": TOOL_CONVERSATION[2]["tool_calls"]}], "only an assistant"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
     "arguments are JSON list, not an object"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}],
     "arguments are not JSON"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": ""}}]}],
     "has no arguments"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a b", "arguments": "{}"}}]}],
     "function name 'a b'"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}],
     "must be a JSON object"),
    ([{"role": "assistant", "content": "", "tool_calls": {"function": {}}}], "must be a list of calls"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"type": "code", "function": {}}]}], "'type': 'function'"),
    ([{"role": "assistant", "content": None}], "must be a string"),
])
def test_bad_conversations_get_one_line_errors(raw, fragment):
    with pytest.raises(DataError, match=re.escape(fragment)) as info:
        to_messages(raw)
    assert "\n" not in str(info.value)


def _assistant_ids(tokenizer, message: Message) -> list[int]:
    """The ids a model generates for ``message``: its turn after the role token."""
    return render_chat(tokenizer, [message]).ids[1:]


def test_a_rendered_reply_parses_back_to_its_text_and_calls(tokenizer):
    calls = (ToolCall("calculator", '{"expression":"347*812"}'), ToolCall("weather", ' {"city": "Paris"}'))
    message = Message("assistant", "Let me see.", calls)
    parsed = parse_reply(tokenizer, _assistant_ids(tokenizer, message), names={"calculator", "weather"})
    assert (parsed.content, parsed.calls, parsed.error) == ("Let me see.", calls, None) and parsed.calls_tools
    assert parsed.text == 'Let me see.<|call|>calculator{"expression":"347*812"}<|call|>weather {"city": "Paris"}'
    plain = parse_reply(tokenizer, _assistant_ids(tokenizer, Message("assistant", "Nay, answer me.")))
    assert (plain.content, plain.calls, plain.error, plain.calls_tools) == ("Nay, answer me.", (), None, False)


@pytest.mark.parametrize("body, fragment", [
    ('{"expression":"1"}', "call 1 does not begin with a function's name"),
    ("calculator", "call 1 to calculator: has no arguments"),
    ('calculator{"expression":', "call 1 to calculator: its arguments are not JSON"),
    ('calculator["1"]', "call 1 to calculator: its arguments are JSON list, not an object"),
    ('calculator{"a":1}}', "its arguments are not JSON (Extra data"),
    ('abacus{"a":1}', "call 1 names 'abacus', which is not among the tools (calculator)"),
    ("x" * 65 + "{}", "longer than a function's name may be"),
    ("calculator" + "[" * 5000, "call 1 to calculator: its arguments nest too deeply"),
])
def test_a_malformed_call_is_reported_never_guessed_at(tokenizer, body, fragment):
    ids = [*encode_plain(tokenizer, ["ok"])[0], ChatTokenIds.of(tokenizer).call, *encode_plain(tokenizer, [body])[0]]
    parsed = parse_reply(tokenizer, ids, names={"calculator"})
    assert fragment in parsed.error and "\n" not in parsed.error and parsed.calls == () and not parsed.calls_tools
    assert parsed.content == "ok" and parsed.text == "ok<|call|>" + body


def test_typed_call_text_is_never_a_call(tokenizer):  # "<|call|>" typed or generated as plain text
    [ids] = encode_plain(tokenizer, ['<|call|>calculator{"expression":"1"}'])
    parsed = parse_reply(tokenizer, ids, names={"calculator"})
    assert parsed.calls == () and parsed.error is None and parsed.content.startswith("<|call|>")


def test_a_tokenizer_from_before_tool_calls_chats_as_before_and_refuses_tools_in_one_line():
    old = pre_tool_tokenizer()
    special = ChatTokenIds.of(old)
    assert not special.has_tools and "tool" not in special.role
    assert special.reply_suppress_ids(tools=False) == special.suppress_ids == (1, 2, 3)
    plain = to_messages(CONVERSATION)
    assert render_chat(old, plain).ids[0] == 1
    with pytest.raises(DataError, match=r"^this run's tokenizer has no tool tokens \(<\|tool\|>, <\|call\|>\)") as info:
        render_chat(old, to_messages(TOOL_CONVERSATION))
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match="no tool tokens"):
        special.require_tools()


def test_the_window_policy_never_separates_a_call_from_its_result(tokenizer):
    messages = to_messages([*CONVERSATION, *TOOL_CONVERSATION[1:], {"role": "user", "content": "Thanks."},
                            {"role": "assistant", "content": "You are welcome."}])
    whole = len(render_chat(tokenizer, messages).ids)
    special = ChatTokenIds.of(tokenizer)
    seen_cuts = set()
    for budget in range(1, whole + 1):
        try:
            fitted = fit_chat(tokenizer, messages, budget)
        except ChatTooLong:
            continue
        seen_cuts.add(fitted.dropped)
        ids = fitted.chat.ids
        # Every kept result has its call before it in the same kept window, and every kept call its result.
        calls, results = ids.count(special.call), ids.count(special.role["tool"])
        assert calls == results, (budget, fitted.dropped)
        first_result = ids.index(special.role["tool"]) if results else None
        assert first_result is None or special.call in ids[:first_result]
    assert len(seen_cuts) >= 3  # the budgets did cut at several places
