"""Conversations for fine-tuning: the two row shapes, their errors, the Shakespeare chat set,
fitting the window at turn boundaries, and length-grouped batches that start at position 0."""

import json
from pathlib import Path

import numpy as np
import pytest

from common.errors import DataError
from data.batches.chat import ChatBatches, collate
from data.chat import ChatTokenIds, ChatTooLong, FittedChat, Message, fit_chat, fit_for_reply, render_chat
from data.config import CHAT_SOURCES, SOURCES, DataConfig, FilesSourceConfig
from data.prepared.chat import tokenize_conversations
from data.sources.conversations import conversations_spec, load_conversations
from data.sources.documents import hash_split
from data.sources.shakespeare import play_files, play_id


def _files_cfg(*paths: Path) -> DataConfig:
    return DataConfig(source="files", format="chat", files=FilesSourceConfig(paths=[str(p) for p in paths]))


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _chat(i: int) -> list[dict]:
    return [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]


def test_messages_and_instruction_columns_become_the_same_conversations(tmp_path):
    messages = _jsonl(tmp_path / "m.jsonl", [{"messages": _chat(i)} for i in range(30)])
    alpaca = _jsonl(tmp_path / "a.jsonl", [
        {"instruction": "Add", "input": "2 and 2", "output": "4"},
        {"instruction": "Greet", "input": "", "output": "Hello."},
    ] * 10)
    loaded = load_conversations(_files_cfg(messages))
    assert len(loaded.train) + len(loaded.val) == 30 and loaded.val  # held out by hash of row ids
    assert all(len(c) == 2 and c[1].role == "assistant" for c in loaded.train + loaded.val)
    both = load_conversations(_files_cfg(alpaca)).train
    assert [Message("user", "Add\n\n2 and 2"), Message("assistant", "4")] in both
    assert [Message("user", "Greet"), Message("assistant", "Hello.")] in both


@pytest.mark.parametrize("row, fragment", [
    ({"messages": [{"role": "user", "content": "hi"}]}, "line 4: the conversation has no assistant turn"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "line 4: message 0 has unknown role 'wizard'"),
    ({"text": "hello"}, "has no 'messages' column (columns: text)"),
])
def test_bad_rows_name_the_file_and_row(tmp_path, row, fragment):
    rows = [{"messages": _chat(i)} for i in range(3)] + [row] if "messages" in row else [row] * 4
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as info:
        load_conversations(_files_cfg(path))
    assert fragment in str(info.value) and str(path) in str(info.value) and "\n" not in str(info.value)


def test_shakespeare_chat_holds_out_the_plays_pretraining_holds_out():
    chat = load_conversations(DataConfig(format="chat"))
    ids = [play_id(p) for p in play_files()]
    _, val = hash_split(ids, 0.1, 1234)
    assert chat.val_from == "held-out plays: " + ", ".join(sorted(ids[i] for i in val))
    assert len(chat.train) > 5 * len(chat.val) > 0
    # Every conversation: a system prompt naming the speaker, then alternating user/assistant turns.
    for conversation in chat.train[:500]:
        assert conversation[0].role == "system" and conversation[0].content.startswith("You are ")
        assert [m.role for m in conversation[1:]] == ["user", "assistant"] * (len(conversation) // 2)
    hamlet = [c for c in chat.train if c[0].content == "You are FRANCISCO in Hamlet."]
    assert [Message("user", "Who's there?"), Message("assistant", "Nay, answer me: stand, and unfold yourself.")] == hamlet[0][1:]


def test_a_conversation_to_answer_leaves_a_quarter_window_for_the_reply_where_dropping_can(tokenizer):
    messages = [Message("system", "Be brief."), Message("user", "one two three four"),
                Message("assistant", "five six seven eight"), Message("user", "nine")]
    whole = render_chat(tokenizer, messages, add_generation_prompt=True)
    last = render_chat(tokenizer, [messages[0], messages[3]], add_generation_prompt=True)
    window = len(whole.ids) + 1  # the whole conversation fits, but leaves one token for the reply
    assert window - len(last.ids) >= window // 4  # and dropping the first exchange leaves a quarter
    assert fit_for_reply(tokenizer, messages, window) == FittedChat(last, 2)
    # When the last exchange alone leaves less than a quarter, it is kept with what room there is.
    assert fit_for_reply(tokenizer, messages[:1] + messages[3:], len(last.ids) + 1) == FittedChat(last, 0)
    with pytest.raises(ChatTooLong):
        fit_for_reply(tokenizer, messages, len(last.ids))


def test_a_long_conversation_keeps_its_system_prompt_and_most_recent_whole_turns(tokenizer):
    messages = [Message("system", "Be brief."), Message("user", "one two three"), Message("assistant", "four five six"),
                Message("user", "seven"), Message("assistant", "eight")]
    whole = render_chat(tokenizer, messages)
    expected = render_chat(tokenizer, [messages[0], *messages[3:]])
    fitted = fit_chat(tokenizer, messages, len(expected.ids))
    assert fitted.dropped == 2 and fitted.chat == expected
    assert fit_chat(tokenizer, messages, len(whole.ids)) == FittedChat(whole, 0)
    system = len(render_chat(tokenizer, messages[:1]).ids)
    with pytest.raises(ChatTooLong, match=f"the last message is {len(expected.ids) - system} tokens and the "
                                          f"system prompt {system}: more than the {len(expected.ids) - 1} tokens"):
        fit_chat(tokenizer, messages, len(expected.ids) - 1)
    _, stats = tokenize_conversations(tokenizer, [messages, messages], len(expected.ids) - 1)
    assert (stats["conversations"], stats["cut"]) == (2, 2)
    _, stats = tokenize_conversations(tokenizer, [messages], len(expected.ids) - 2)
    assert (stats["conversations"], stats["dropped"]) == (0, 1)


def test_batches_start_every_conversation_at_position_0_and_learn_only_replies(tokenizer):
    conversations = [[Message("system", "s" * (i % 5)), Message("user", f"u{i}"), Message("assistant", "a" * (i % 7 + 1))]
                     for i in range(40)]
    split, _ = tokenize_conversations(tokenizer, conversations, 64)
    special = ChatTokenIds.of(tokenizer)
    rows = np.arange(5)
    x, y = collate(split, rows, pad_id=0)
    for r in rows:
        rendered = render_chat(tokenizer, conversations[r])
        n = len(rendered.ids) - 1
        assert x[r, 0].item() == special.role["system"] and x[r, :n].tolist() == rendered.ids[:-1]
        expected = [t if m else -1 for t, m in zip(rendered.ids[1:], rendered.loss_mask[1:])]
        assert y[r, :n].tolist() == expected and y[r, n:].eq(-1).all()
        assert expected[-1] == special.end  # the reply's end-of-turn token is learned

    batches = ChatBatches(split, 4, pad_id=0, seed=3)
    seen = [batches.next() for _ in range(10)]  # one epoch: every conversation once
    assert sum(int((y[:, :1] != -2).sum()) for _, y in seen) == 40
    assert 0 <= batches.padding_fraction < 0.5  # (their state restores the stream: test_sft.py's resumed run)


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_either_holds_conversations_or_is_refused_for_chat(source, tmp_path):
    # synthetic once fell through to the files reader: "KeyError: 'pop from an empty set'" on resume.
    (tmp_path / "a.jsonl").write_text("")
    settings = {"source": source, "format": "chat", "hub": {"name": "some/dataset"},
                "files": {"paths": [str(tmp_path / "a.jsonl")]}}
    if source not in CHAT_SOURCES:
        with pytest.raises(DataError, match=f"^data.source {source} makes text, not conversations.*data.format: text$"):
            DataConfig.from_dict(settings)
        return
    spec = conversations_spec(DataConfig.from_dict(settings))
    assert spec["type"] == {"shakespeare": "shakespeare-chat", "calculator": "calculator-chat"}.get(source, source)
