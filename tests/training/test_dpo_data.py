"""Reply pairs for DPO: read in both of TRL's shapes, rendered by the chat format exactly as the
whole conversation renders, the loss mask on the reply alone, the prompt cut to fit the window,
bad rows refused in one line naming the row, batches laid out chosen-then-rejected, and the cache
entry reused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from data.chat import Message, render_chat
from data.config import DataConfig, FilesSourceConfig
from data.errors import DataError
from run_testkit import chat_tokenizer
from training.tasks.dpo.batches import PreferenceBatches, collate_pairs
from training.tasks.dpo.pairs import PreferencePair, pair_from_row
from training.tasks.dpo.prepared import prepare_preference_data, render_pair, tokenize_pairs

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
    assert render_pair(tokenizer, long_reply, window) is None
    split, stats = tokenize_pairs(tokenizer, [pair, long_reply, _pair()], window - 1)
    assert (stats["pairs"], stats["cut"], stats["dropped"]) == (len(split), 1, 1) == (2, 1, 1)


@pytest.mark.parametrize("row, fragment", [
    ({"prompt": "Hi", "chosen": "Yes"}, "rejected is missing"),
    ({"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}], "chosen": "a",
      "rejected": "b"}, "the prompt ends with an assistant turn"),
    ({"prompt": "Hi", "chosen": [{"role": "user", "content": "x"}], "rejected": "b"},
     "chosen must begin with the assistant's reply"),
    ({"prompt": "Hi", "chosen": "a", "rejected": []}, "rejected is an empty list"),
    ({"prompt": "Hi", "chosen": "a", "rejected": [{"role": "robot", "content": "b"}]}, "unknown role 'robot'"),
])
def test_a_bad_row_is_refused_naming_the_file_and_row(tmp_path, tokenizer, row, fragment):
    good = {"prompt": "Hi", "chosen": "a", "rejected": "b"}
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [good, good, row]), encoding="utf-8")
    tokenizer_file = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_file))
    cfg = DataConfig(source="files", format="preference", cache_dir=str(tmp_path / "cache"),
                     files=FilesSourceConfig(paths=[str(path)]))
    with pytest.raises(DataError) as error:
        prepare_preference_data(cfg, tokenizer_file, 64, progress=False)
    message = str(error.value)
    assert f"{path} row 2" in message and fragment in message and "\n" not in message


def test_preference_data_comes_from_files_or_the_hub():
    with pytest.raises(DataError, match="data.format: preference reads reply pairs from data.source files or hub"):
        DataConfig(source="shakespeare", format="preference")


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


def test_training_batches_resume_exactly_and_cover_every_pair_once_an_epoch(tokenizer):
    pairs = [_pair(chosen=f"answer {i}.", rejected="no " * (i % 5 + 1)) for i in range(10)]
    split, _ = tokenize_pairs(tokenizer, pairs, 128)
    batches = PreferenceBatches(split, 2, pad_id=0, seed=3)
    seen = [batches.next() for _ in range(5)]
    chosen_rows = sorted(tuple(row[row != 0].tolist()) for x, _ in seen for row in x[:2])
    assert len(set(chosen_rows)) == 10
    state = batches.state_dict()
    after = [batches.next() for _ in range(3)]
    again = PreferenceBatches(split, 2, pad_id=0, seed=3)
    again.load_state_dict(state)
    for (x1, y1), (x2, y2) in zip(after, [again.next() for _ in range(3)]):
        assert x1.equal(x2) and y1.equal(y2)
    assert 0 <= batches.padding_fraction < 1


def test_an_entry_is_built_once_and_reused(tmp_path, tokenizer, monkeypatch):
    path = tmp_path / "pairs.jsonl"
    rows = [_pair(chosen=f"answer {i}.", rejected="no " * (i % 4 + 1)).to_row() for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tokenizer_file = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_file))
    cfg = DataConfig(source="files", format="preference", cache_dir=str(tmp_path / "cache"), val_fraction=0.2,
                     files=FilesSourceConfig(paths=[str(path)]))
    first = prepare_preference_data(cfg, tokenizer_file, 64, progress=False)
    assert len(first.train) + len(first.val) == 30 and len(first.val) > 0
    import training.tasks.dpo.prepared as module

    monkeypatch.setattr(module, "load_preferences", lambda *a, **k: pytest.fail("read the pairs again"))
    again = prepare_preference_data(cfg, tokenizer_file, 64, progress=False)
    assert again.directory == first.directory
    assert again.train.chosen.ids.tolist() == first.train.chosen.ids.tolist()
    assert again.val.rejected.mask.tolist() == first.val.rejected.mask.tolist()
