"""Chat preparation in the text preparation's cache: an entry reused without reading the conversations, a
damaged one refused and rebuilt equal, a failed build leaving nothing, other processes waiting for the main one."""

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import data.prepared.chat as chat_module
from common.errors import DataError
from data.config import DataConfig, FilesSourceConfig
from data.prepared.chat import PreparedChat, prepare_chat_data
from data.tokenizer import train_tokenizer
from data_testkit import cache_contents, make_documents

BLOCK_SIZE = 64


@pytest.fixture
def chat_setup(tmp_path: Path) -> tuple[DataConfig, Path]:
    """(config, tokenizer file): 40 short conversations as JSONL, and a tokenizer with the chat tokens."""
    rows = [{"messages": [{"role": "user", "content": f"question {i}: {text[:60]}"},
                          {"role": "assistant", "content": f"answer {i}: {text[60:120]}"}]}
            for i, text in enumerate(make_documents(40))]
    corpus = tmp_path / "chats.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tokenizer_file = tmp_path / "tokenizer.json"
    train_tokenizer(make_documents(40), 400).save(str(tokenizer_file))
    cfg = DataConfig(source="files", format="chat", cache_dir=str(tmp_path / "cache"),
                     files=FilesSourceConfig(paths=[str(corpus)]))
    return cfg, tokenizer_file


def _prepare(setup: tuple[DataConfig, Path], **kwargs) -> PreparedChat:
    cfg, tokenizer_file = setup
    return prepare_chat_data(cfg, tokenizer_file, BLOCK_SIZE, progress=False, **kwargs)


def _arrays(chat: PreparedChat) -> list[np.ndarray]:
    return [np.array(a) for split in (chat.train, chat.val) for a in (split.ids, split.mask, split.offsets)]


def test_an_entry_is_reused_without_reading_the_conversations(chat_setup, monkeypatch):
    first = _prepare(chat_setup)
    assert len(first.train) > 0 and len(first.val) > 0
    assert first.train.offsets[-1] == len(first.train.ids) == first.meta["splits"]["train"]["tokens"]

    monkeypatch.setattr(chat_module, "load_conversations", lambda *a, **k: pytest.fail("read them again"))
    second = _prepare(chat_setup)
    assert second.directory == first.directory and second.meta == first.meta
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(first), _arrays(second)))
    assert cache_contents(chat_setup[0]) == [first.directory.name]


def _damage(entry: Path, how: str) -> None:
    conversations = entry / chat_module.CONVERSATIONS_FILE
    if how == "truncated":
        with open(conversations, "r+b") as f:
            f.truncate(conversations.stat().st_size // 2)
    elif how == "overwritten_same_size":
        raw = bytearray(conversations.read_bytes())
        middle = len(raw) // 2
        raw[middle : middle + 16] = bytes(b ^ 0xFF for b in raw[middle : middle + 16])  # np.load still reads it
        conversations.write_bytes(bytes(raw))
    elif how == "meta_is_a_list":
        (entry / "meta.json").write_text("[]")
    else:
        meta = json.loads((entry / "meta.json").read_text())
        del meta["conversations_sha256"]
        (entry / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("how", ["truncated", "overwritten_same_size", "meta_is_a_list", "meta_lost_checksum"])
def test_a_damaged_entry_is_refused_then_rebuilt_equal(chat_setup, how):
    original = _prepare(chat_setup)
    before = _arrays(original)
    _damage(original.directory, how)
    with pytest.raises(DataError, match="delete that cache entry"):
        PreparedChat.open(original.directory, chat_setup[1])
    rebuilt = _prepare(chat_setup)
    assert rebuilt.directory == original.directory
    assert all(np.array_equal(a, b) for a, b in zip(before, _arrays(rebuilt)))
    assert cache_contents(chat_setup[0]) == [original.directory.name]


def test_a_failed_build_leaves_nothing_and_the_next_one_succeeds(chat_setup, monkeypatch):
    real = chat_module.tokenize_conversations
    calls = []

    def crash_on_val(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # like Ctrl-C halfway through
        return real(*args, **kwargs)

    monkeypatch.setattr(chat_module, "tokenize_conversations", crash_on_val)
    with pytest.raises(KeyboardInterrupt):
        _prepare(chat_setup)
    assert cache_contents(chat_setup[0]) == []
    monkeypatch.setattr(chat_module, "tokenize_conversations", real)
    assert len(_prepare(chat_setup).val) > 0


def _wait_in_thread(setup, results: dict[str, object]) -> threading.Thread:
    def worker() -> None:
        try:
            results["data"] = _prepare(setup, is_main=False, wait_timeout_s=120)
        except BaseException as exc:  # report in the main thread
            results["error"] = exc

    thread = threading.Thread(target=worker)
    thread.start()
    return thread


def test_other_processes_wait_for_the_main_one_even_past_a_damaged_entry(chat_setup):
    with pytest.raises(DataError, match="waited 0.2 s for the main process"):  # in one line, when it times out
        _prepare(chat_setup, is_main=False, wait_timeout_s=0.2)
    results: dict[str, object] = {}
    thread = _wait_in_thread(chat_setup, results)
    time.sleep(0.3)
    assert not results  # nothing to return until the main process has prepared
    main = _prepare(chat_setup)
    thread.join(timeout=120)
    assert "error" not in results and results["data"].directory == main.directory

    _damage(main.directory, "overwritten_same_size")
    results.clear()
    thread = _wait_in_thread(chat_setup, results)
    time.sleep(0.3)
    assert not results  # a damaged entry is not taken: the waiter keeps waiting
    rebuilt = _prepare(chat_setup)
    thread.join(timeout=120)
    assert "error" not in results
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(rebuilt), _arrays(results["data"])))


def test_a_build_that_loses_the_race_to_publish_takes_the_winners_entry(chat_setup, monkeypatch):
    real = chat_module.load_conversations
    winner: dict[str, PreparedChat] = {}

    def another_process_finishes_first(*args, **kwargs):
        monkeypatch.setattr(chat_module, "load_conversations", real)
        winner["data"] = _prepare(chat_setup)  # publishes the entry while our build is under way
        return real(*args, **kwargs)

    monkeypatch.setattr(chat_module, "load_conversations", another_process_finishes_first)
    ours = _prepare(chat_setup)
    assert ours.directory == winner["data"].directory and ours.meta == winner["data"].meta
    assert cache_contents(chat_setup[0]) == [ours.directory.name]  # our temporary directory is gone
