"""Reply pairs for DPO: both of TRL's shapes, rendered as the whole conversation with the loss on the reply,
cut to fit the window, bad rows refused in one line naming the row, batches chosen-then-rejected, the cache reused."""

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import training.tasks.dpo.prepared as module
from common.errors import DataError
from data.chat import Message, render_chat
from data.config import DataConfig, FilesSourceConfig
from run_testkit import chat_tokenizer
from training.tasks.dpo.batches import PreferenceBatches, collate_pairs
from training.tasks.dpo.pairs import PreferencePair, pair_from_row
from training.tasks.dpo.prepared import PairTooLong, prepare_preference_data, render_pair, tokenize_pairs

SYSTEM, USER = Message("system", "You are ROMEO."), Message("user", "What light through yonder window breaks?")


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer(400)


def _pair(chosen: str = "It is the east.", rejected: str = "the east the east the east", prompt=(SYSTEM, USER)):
    return PreferencePair(tuple(prompt), (Message("assistant", chosen),), (Message("assistant", rejected),))


def test_both_shapes_read_to_the_same_pair():
    conversational = {"prompt": [{"role": "user", "content": "Hi?"}],
                      "chosen": [{"role": "assistant", "content": "Hello."}],
                      "rejected": [{"role": "assistant", "content": "Go."}]}
    standard = {"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go."}
    assert pair_from_row(conversational, "a") == pair_from_row(standard, "b")
    assert pair_from_row(standard, "b").to_row() == conversational


def test_each_sequence_is_the_whole_conversation_rendered_with_the_mask_on_the_reply_alone(tokenizer):
    earlier = (SYSTEM, Message("user", "Who is there?"), Message("assistant", "A friend."), USER)
    pair = _pair(prompt=earlier)
    chosen, rejected, dropped = render_pair(tokenizer, pair, 200)
    assert dropped == 0
    for rendered, reply in ((chosen, pair.chosen), (rejected, pair.rejected)):
        whole = render_chat(tokenizer, [*earlier, *reply])
        assert rendered.ids == whole.ids
        prompt_length = len(render_chat(tokenizer, earlier, add_generation_prompt=True).ids)
        # The earlier assistant turn carries no loss here: only the reply being compared does.
        assert rendered.loss_mask == [False] * prompt_length + [True] * (len(whole.ids) - prompt_length)


def test_the_prompt_is_cut_to_leave_room_for_the_longer_reply_and_a_pair_that_cannot_fit_is_dropped(tokenizer):
    old = (SYSTEM, Message("user", "Who is there?"), Message("assistant", "A friend, a friend, a friend."), USER)
    pair = _pair(prompt=old, rejected="the east " * 6)
    full = render_pair(tokenizer, pair, 1000)
    window = len(full[1].ids) - 2  # too short for the whole rejected sequence
    chosen, rejected, dropped = render_pair(tokenizer, pair, window)
    assert dropped == 2 and len(rejected.ids) <= window
    # The system prompt is kept, the old exchange dropped, both sequences share the cut prompt.
    expected = render_chat(tokenizer, [SYSTEM, USER], add_generation_prompt=True).ids
    assert chosen.ids[:len(expected)] == rejected.ids[:len(expected)] == expected

    long_reply = _pair(rejected="the east " * 200)
    with pytest.raises(PairTooLong, match="its longer reply is .* tokens, more than the whole window"):
        render_pair(tokenizer, long_reply, window)
    split, stats = tokenize_pairs(tokenizer, [pair, long_reply, _pair()], window - 1)
    assert (stats["pairs"], stats["cut"], stats["dropped"]) == (len(split), 1, 1) == (2, 1, 1)


def test_a_batch_is_the_chosen_rows_then_the_rejected_rows_padded_to_one_width(tokenizer):
    pairs = [_pair(), _pair(chosen="Soft!", rejected="the east " * 5), _pair(chosen="Juliet is the sun, arise.")]
    split, _ = tokenize_pairs(tokenizer, pairs, 128)
    x, y = collate_pairs(split, np.array([2, 0, 1]), pad_id=7)
    assert x.shape[0] == 6 and x.shape[1] == int(split.lengths.max()) - 1
    for row, (side, i) in enumerate([("chosen", 2), ("chosen", 0), ("chosen", 1),
                                     ("rejected", 2), ("rejected", 0), ("rejected", 1)]):
        ids, mask = getattr(split, side).conversation(i)
        n = len(ids) - 1
        assert x[row, :n].tolist() == ids[:-1].tolist() and (x[row, n:] == 7).all()
        assert y[row, :n].tolist() == np.where(mask[1:], ids[1:].astype(np.int64), -1).tolist() and (y[row, n:] == -1).all()
    assert split.first_reply_prompt(0) == render_chat(tokenizer, [SYSTEM, USER], add_generation_prompt=True).ids


def test_training_batches_cover_every_pair_once_an_epoch(tokenizer):
    # (Their state restores the stream exactly: test_dpo.py's run resumes to the same weights.)
    pairs = [_pair(chosen=f"answer {i}.", rejected="no " * (i % 5 + 1)) for i in range(10)]
    split, _ = tokenize_pairs(tokenizer, pairs, 128)
    batches = PreferenceBatches(split, 2, pad_id=0, seed=3)
    seen = [batches.next() for _ in range(5)]
    chosen_rows = sorted(tuple(row[row != 0].tolist()) for x, _ in seen for row in x[:2])
    assert len(set(chosen_rows)) == 10
    assert 0 <= batches.padding_fraction < 1


def test_an_entry_is_built_once_and_reused_and_a_json_array_reads_as_its_items(tmp_path, tokenizer, monkeypatch):
    path = tmp_path / "pairs.jsonl"
    rows = [_pair(chosen=f"answer {i}.", rejected="no " * (i % 4 + 1)).to_row() for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    first = _prepared(tmp_path, tokenizer, path)
    assert len(first.train) + len(first.val) == 30 and len(first.val) > 0
    monkeypatch.setattr(module, "load_preferences", lambda *a, **k: pytest.fail("read the pairs again"))
    again = _prepared(tmp_path, tokenizer, path)
    assert again.directory == first.directory and again.train.chosen.ids.tolist() == first.train.chosen.ids.tolist()
    assert again.val.rejected.mask.tolist() == first.val.rejected.mask.tolist()
    monkeypatch.undo()
    array = tmp_path / "array" / "pairs.jsonl"  # the same name: the rows' ids hold it
    array.parent.mkdir()
    array.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    items = _prepared(tmp_path / "array", tokenizer, array)
    assert items.train.chosen.ids.tolist() == first.train.chosen.ids.tolist() and len(items.val) == len(first.val)
    array.write_text(json.dumps([*rows[:3], "oops"]), encoding="utf-8")
    assert f"{array} item 4: a JSON string, not an object" in _refusal(tmp_path, tokenizer, array)


# Preference files as a hostile user writes them: every case names the file and its 1-based line
# (or, for the whole file, the file) and says what is wrong, in one line.

GOOD = json.dumps({"prompt": "Hi", "chosen": "a", "rejected": "b"})


def _third(row: dict) -> str:
    return f"{GOOD}\n{GOOD}\n{json.dumps(row)}\n"


@pytest.mark.parametrize("content, where, fragment", [
    (f"{GOOD}\n{GOOD}\n{GOOD}\n" + json.dumps({"prompt": "x", "rejected": "y"}) + f"\n{GOOD}\n", "line 4",
     "the pair has no chosen; give it prompt, chosen and rejected"),
    (f"{GOOD}\n{GOOD}\n{GOOD}\n" + '{"prompt": "x", "chosen": "ab', "line 4",
     "not one whole JSON object (Unterminated string starting at column 27 (the line ends inside it: cut short?))"),
    (f"{GOOD}\n{GOOD}\n\n" + '{"prompt": "x", "chosen": "ab\n' + f"{GOOD}\n", "line 4", "(the line ends inside it"),
    (f"{GOOD}\n[{GOOD}, {GOOD}]\n", "line 2", "a JSON array, not an object; write each row as one object on a line"),
    (f"[{GOOD}, {GOOD}]\n{GOOD}\n", "line 1", "a JSON array, not an object"),
    (f"{GOOD}\n\"a string\"\n", "line 2", "a JSON string, not an object"),
    (f"{GOOD}\n{{'prompt': 'single quotes'}}\n", "line 2", "not one whole JSON object (Expecting property name"),
    (_third({"prompt": "x", "chosen": 7, "rejected": "y"}), "line 3", "chosen: a conversation must be a list of"),
    (_third({"prompt": "Hi", "chosen": "Yes"}), "line 3", "the pair has no rejected"),
    (_third({"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}], "chosen": "a",
             "rejected": "b"}), "line 3", "the prompt ends with an assistant turn"),
    (_third({"prompt": "Hi", "chosen": [{"role": "user", "content": "x"}], "rejected": "b"}), "line 3",
     "chosen must begin with the assistant's reply"),
    (_third({"prompt": "Hi", "chosen": "a", "rejected": []}), "line 3", "rejected is an empty list"),
    (_third({"prompt": "Hi", "chosen": "a", "rejected": [{"role": "robot", "content": "b"}]}), "line 3",
     "unknown role 'robot'"),
    (f"{GOOD}\n" + json.dumps({"prompt": "x", "chosen": "a", "rejected": None}) + f"\n{GOOD}\n", "line 2",
     "the pair has no rejected"),
    (f"{GOOD}\n".encode() + b'{"prompt": "caf\xe9", "chosen": "a", "rejected": "b"}\n', "line 2",
     "not valid UTF-8 (byte 0xe9, the line's byte 16); fix the file, or set data.files.encoding_errors: replace"),
    ("", "", "is empty: write one JSON object per line"),
    ("\n   \n\n", "", "has only blank lines (3): write one JSON object per line"),
    (f"{GOOD}\n", "", "there is one reply pair, and holding some out for validation needs at least 2"),
    (json.dumps({"question": "x", "answer": "y"}) + "\n", "",
     "has no 'prompt', 'chosen', 'rejected' column (columns: question, answer)"),
], ids=["missing-chosen", "cut-mid-object", "cut-mid-string", "array-line", "array-first-line", "string-line",
        "python-dict", "number-reply", "no-rejected", "prompt-ends-with-assistant", "reply-from-user", "empty-reply",
        "unknown-role", "null-reply", "not-utf8", "empty-file", "blank-lines", "one-pair", "other-columns"])
def test_a_hostile_preference_file_is_one_line_naming_the_file_and_line(tmp_path, tokenizer, content, where,
                                                                          fragment):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    message = _refusal(tmp_path, tokenizer, path)
    assert "\n" not in message and fragment in message, message
    assert (f"{path} {where}: " if where else str(path)) in message, message


@pytest.mark.parametrize("pair, fragment", [
    ({"prompt": "word " * 3000, "chosen": "a", "rejected": "b"}, "its prompt needs 9,004 tokens even cut to its last message,"),
    ({"prompt": [{"role": "system", "content": "You are ROMEO."}, {"role": "user", "content": "word " * 3000}],
      "chosen": "a", "rejected": "b"}, "even cut to its last message and system prompt"),
    ({"prompt": "Hi", "chosen": "a", "rejected": "the east " * 300}, "its longer reply is "),
], ids=["long-prompt", "long-prompt-with-a-system-prompt", "long-reply"])
def test_a_pair_too_long_for_the_window_blames_the_part_that_is(tmp_path, tokenizer, pair, fragment):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(pair) + "\n" for _ in range(4)), encoding="utf-8")
    message = _refusal(tmp_path, tokenizer, path)
    assert "\n" not in message and "no training reply pair fits in model.block_size 64" in message
    assert re.search(rf"the first: {re.escape(str(path))} line \d: its ", message) and fragment in message, message
    shorten = "shorten the replies" if "reply is" in fragment else "shorten the prompt"
    assert message.endswith(shorten)


def _prepared(folder: Path, tokenizer, path: Path):
    """``path``'s pairs prepared for a window of 64, into a cache under ``folder``."""
    folder.mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = DataConfig(source="files", format="preference", cache_dir=str(folder / "cache"), val_fraction=0.2,
                        files=FilesSourceConfig(paths=[str(path)]))
    return prepare_preference_data(config, folder / "tokenizer.json", 64, progress=False)


def _refusal(folder: Path, tokenizer, path: Path) -> str:
    with pytest.raises(DataError) as error:
        _prepared(folder, tokenizer, path)
    return str(error.value)


def test_a_bad_row_of_a_parquet_file_is_named_by_its_1_based_row(tmp_path, tokenizer):
    rows = [{"prompt": "Hi", "chosen": "a", "rejected": "b"}] * 3 + [{"prompt": "Hi", "chosen": None, "rejected": "b"}]
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    message = _refusal(tmp_path, tokenizer, path)
    assert message == f"{path} row 4: the pair has no chosen; give it prompt, chosen and rejected"
