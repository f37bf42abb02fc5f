"""The chat format: reserved tokens, known text and ids, loss masks token by token."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from data import DataError
from data.chat import (
    CHAT_SPECIAL_TOKENS,
    CHAT_TEMPLATE,
    END_OF_TURN,
    ChatTokenIds,
    Message,
    chat_text,
    encode_plain,
    render_chat,
    to_messages,
)
from data.tokenizer import EOT, new_tokenizer, train_tokenizer

from data_testkit import make_documents

CONVERSATION = [
    {"role": "system", "content": "You are Hamlet."},
    {"role": "user", "content": "Who's there?"},
    {"role": "assistant", "content": "Nay, answer me."},
    {"role": "user", "content": "Long live the king!"},
    {"role": "assistant", "content": "Bernardo?"},
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(make_documents(30), vocab_size=400)


def test_every_trained_tokenizer_reserves_the_chat_tokens_after_eot(tokenizer):
    assert tokenizer.token_to_id(EOT) == 0
    assert [tokenizer.token_to_id(t) for t in CHAT_SPECIAL_TOKENS] == [1, 2, 3, 4]
    assert tokenizer.get_vocab_size() == 400


def test_known_messages_render_to_known_text_and_ids(tokenizer):
    messages = to_messages(CONVERSATION[:3])
    assert chat_text(messages) == (
        "<|system|>You are Hamlet.<|end|><|user|>Who's there?<|end|><|assistant|>Nay, answer me.<|end|>"
    )
    assert chat_text(messages[:2], add_generation_prompt=True).endswith("<|end|><|assistant|>")
    ids = render_chat(tokenizer, messages).ids
    plain = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    assert ids == [1, *plain("You are Hamlet."), 4, 2, *plain("Who's there?"), 4,
                   3, *plain("Nay, answer me."), 4]
    # The rendered text, tokenized with special tokens recognised (what transformers does with
    # the Jinja template's output), gives the same ids.
    assert tokenizer.encode(chat_text(messages), add_special_tokens=False).ids == ids


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


def test_generation_prompt_adds_an_unlearned_assistant_token(tokenizer):
    rendered = render_chat(tokenizer, to_messages(CONVERSATION[:2]), add_generation_prompt=True)
    assert rendered.ids[-1] == ChatTokenIds.of(tokenizer).role["assistant"]
    assert not any(rendered.loss_mask)


def test_turn_by_turn_rendering_equals_whole_rendering(tokenizer):
    messages = to_messages(CONVERSATION)
    whole = render_chat(tokenizer, messages).ids
    pieces = [i for m in messages for i in render_chat(tokenizer, [m]).ids]
    assert pieces == whole


@pytest.mark.parametrize("text", ["<|end|>", "a<|user|>b", "<|endoftext|><|assistant|>", END_OF_TURN * 3])
def test_plain_text_never_becomes_a_special_token(tokenizer, text):
    specials = {tokenizer.token_to_id(t) for t in (EOT, *CHAT_SPECIAL_TOKENS)}
    [ids] = encode_plain(tokenizer, [text])
    assert not specials & set(ids)
    assert tokenizer.decode(ids) == text
    rendered = render_chat(tokenizer, [Message("user", text)]).ids
    assert not specials & set(rendered[1:-1])
    assert tokenizer.encode_special_tokens is False  # the flag is restored


def test_jinja_template_renders_exactly_chat_text():
    jinja2 = pytest.importorskip("jinja2")
    template = jinja2.Environment().from_string(CHAT_TEMPLATE)
    messages = to_messages(CONVERSATION)
    for prompt in (False, True):
        rendered = template.render(messages=CONVERSATION, add_generation_prompt=prompt,
                                   raise_exception=lambda message: None)
        assert rendered == chat_text(messages, add_generation_prompt=prompt)


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ("hello", "must be a list"),
        ([{"role": "user"}], "'role' and 'content'"),
        ([{"role": "narrator", "content": "x"}], "unknown role 'narrator'"),
        ([{"role": "user", "content": 3}], "must be a string"),
    ],
)
def test_bad_conversations_get_one_line_errors(raw, fragment):
    with pytest.raises(DataError, match=fragment) as info:
        to_messages(raw)
    assert "\n" not in str(info.value)


def test_a_tokenizer_without_chat_tokens_is_refused_with_the_fix():
    old = new_tokenizer()
    old.add_special_tokens([EOT])
    with pytest.raises(DataError, match="trained before the chat format.*pretrain a new run"):
        ChatTokenIds.of(old)
