"""prepare_data's cache: token files equal a direct tokenization, an entry is reused, rebuilt or left
half-made by nothing; and a cache entry is trusted for its content, not its size: token files overwritten
in place, truncated, ids beyond the vocabulary and a meta.json that parses to the wrong shape all get the
entry rebuilt, and the rebuilt entry equals the original. Chat preparation shares the cache: an entry reused
without reading the conversations, a damaged one refused and rebuilt equal, and, for text and chat alike, a
failed build leaving nothing and other processes waiting for the main one, even past a damaged entry."""

import errno
import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import data.prepared.chat as chat_module
import data.prepared.text as prepare_module
import data.sources.shakespeare as shakespeare_module
from common.errors import DataError, describe_os_error
from data.config import DataConfig, FilesSourceConfig
from data.prepared.chat import PreparedChat, prepare_chat_data
from data.prepared.text import PreparedData, entry_dir, prepare_data
from data.prepared.token_files import digest_token_file
from data.sources.documents import hash_split
from data.sources.shakespeare import shakespeare_documents
from data_testkit import cache_contents, direct_tokens, make_documents


def _split_texts(folder: Path, val_ids: list[str]) -> tuple[list[str], list[str]]:
    files = sorted(folder.glob("*.txt"))
    train = [f.read_text(encoding="utf-8") for f in files if f.name not in val_ids]
    val = [f.read_text(encoding="utf-8") for f in files if f.name in val_ids]
    return train, val


def _folder_cfg(tmp_path: Path, folder: Path, **settings) -> DataConfig:
    settings.setdefault("vocab_size", 300)
    files = FilesSourceConfig(paths=[str(folder / "*.txt")])
    return DataConfig(source="files", cache_dir=str(tmp_path / "cache"), files=files, **settings)


def test_token_files_equal_a_direct_tokenization(files_cfg, txt_corpus):
    data = prepare_data(files_cfg, progress=False)
    meta = data.meta
    val_ids = meta["val_document_ids"]
    train_texts, val_texts = _split_texts(txt_corpus, val_ids)
    assert val_ids and len(train_texts) + len(val_texts) == 12
    tok = data.tokenizer()
    assert data.train_tokens().dtype == np.uint16 and data.train_tokens().tolist() == direct_tokens(tok, train_texts)
    assert data.val_tokens().tolist() == direct_tokens(tok, val_texts)
    for split, texts in (("train", train_texts), ("val", val_texts)):
        stats = meta["splits"][split]
        assert stats["documents"] == len(texts) and stats["bytes"] == sum(len(t.encode("utf-8")) for t in texts)
    # Byte accounting agrees with the text: EOTs count 0, every other token its bytes.
    assert data.token_bytes()[np.asarray(data.val_tokens())].sum() == meta["splits"]["val"]["bytes"]
    assert data.eot_id == 0 and data.vocab_size == tok.get_vocab_size()
    assert meta["source"]["type"] == "files" and meta["tokenizer"]["vocab_size"] == 300
    assert len(meta["tokenizer_sha256"]) == 64 and meta["created"]
    assert json.loads((data.directory / "meta.json").read_text(encoding="utf-8")) == meta  # plain JSON on disk
    assert sorted(os.listdir(data.directory)) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]


def test_tokenizer_is_trained_on_the_training_split_only(tmp_path):
    names = [f"doc{i:02d}.txt" for i in range(10)]
    _, val_idx = hash_split(names, 0.2, seed=5)
    folder = tmp_path / "c"
    folder.mkdir()
    for i, (name, text) in enumerate(zip(names, make_documents(10))):
        extra = " zebrafish" * 300 if i in val_idx else ""
        (folder / name).write_text(text + extra, encoding="utf-8")
    cfg = _folder_cfg(tmp_path, folder, vocab_size=400, val_fraction=0.2, split_seed=5)
    tok = prepare_data(cfg, progress=False).tokenizer()
    assert "Ġzebrafish" not in tok.get_vocab() and len(tok.encode(" zebrafish").ids) > 3


def test_cache_hit_reuses_the_entry_without_reading_the_corpus_and_progress_says_which(files_cfg, monkeypatch, capsys):
    first = prepare_data(files_cfg, progress=True)
    err = capsys.readouterr().err
    assert "tokenizing train" in err and "training tokenizer" in err
    summary = [line for line in err.splitlines() if line.startswith("data: prepared")]
    assert len(summary) == 1 and "documents" in summary[0] and "bytes/token" in summary[0]
    monkeypatch.setattr(prepare_module, "load_source", lambda *a, **k: pytest.fail("the corpus was read again"))
    second = prepare_data(files_cfg, progress=True)
    assert second.directory == first.directory and second.meta == first.meta
    assert "data: using cached" in capsys.readouterr().err
    prepare_data(files_cfg, progress=False)
    assert capsys.readouterr().err == ""


def test_changed_settings_or_files_make_a_new_entry(files_cfg, txt_corpus):
    first = prepare_data(files_cfg, progress=False).directory
    other_vocab = prepare_data(files_cfg.model_copy(update=dict(vocab_size=320)), progress=False).directory
    other_seed = entry_dir(files_cfg.model_copy(update=dict(split_seed=99)))
    assert len({first, other_vocab, other_seed}) == 3
    doc = txt_corpus / "doc00.txt"
    doc.write_text(doc.read_text(encoding="utf-8") + " more", encoding="utf-8")
    assert entry_dir(files_cfg) != first and first.is_dir() and other_vocab.is_dir()


_KILLED_PREPARE = """
import sys, time
from pathlib import Path
import data.prepared.text as prepare
from data.config import DataConfig, FilesSourceConfig

real = prepare._write_tokens

def write_then_hang(dataset, path, *, label, **kwargs):
    stats = real(dataset, path, label=label, **kwargs)
    if label == "train":  # train.bin is written: tell the test, then wait to be killed
        Path(sys.argv[3]).write_text("ready")
        time.sleep(600)
    return stats

prepare._write_tokens = write_then_hang
files = FilesSourceConfig(paths=[sys.argv[1]])
prepare.prepare_data(DataConfig(source="files", vocab_size=300, val_fraction=0.25, cache_dir=sys.argv[2],
                                 files=files), progress=False)
"""


def test_a_prepare_killed_halfway_is_never_taken_for_a_finished_one(files_cfg, tmp_path):
    ready = tmp_path / "ready"
    root = Path(__file__).resolve().parents[2]
    args = [sys.executable, "-c", _KILLED_PREPARE, files_cfg.files.paths[0], files_cfg.cache_dir, str(ready)]
    child = subprocess.Popen(args, cwd=root)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the child prepare never reached the middle"
    finally:
        child.kill()  # SIGKILL: no cleanup code runs
        child.wait()
    entry = entry_dir(files_cfg)
    assert not entry.exists()
    leftovers = [p for p in entry.parent.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and (leftovers[0] / "train.bin").exists()
    data = prepare_data(files_cfg, progress=False)
    assert data.directory == entry and data.val_tokens().size > 0 and cache_contents(files_cfg) == [entry.name]


def test_dead_prepares_temp_dirs_are_removed_and_other_hosts_spared(files_cfg):
    entry = entry_dir(files_cfg)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # Temp dirs of dead prepares on this host are removed; another host's may still be in use.
    stale = entry.parent / f".tmp-{entry.name}-0badc0de-{dead.pid}@{socket.gethostname()}"
    elsewhere = entry.parent / f".tmp-{entry.name}-0badc0de-{dead.pid}@another-host"
    stale.mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    data = prepare_data(files_cfg, progress=False)
    assert not stale.exists() and elsewhere.exists()
    assert data.directory == entry


def test_shakespeare_metadata_lists_the_held_out_plays(tmp_path, monkeypatch):
    ids, texts = shakespeare_documents()
    # Real plays, cut short so the test stays fast (the full corpus is the benchmark's job).
    short = [t[:3000] for t in texts]
    monkeypatch.setattr(shakespeare_module, "shakespeare_documents", lambda progress=False: (ids, short))
    cfg = DataConfig(vocab_size=300, cache_dir=str(tmp_path / "cache"))
    data = prepare_data(cfg, progress=False)
    _, val_idx = hash_split(ids, cfg.val_fraction, cfg.split_seed)
    assert data.meta["val_document_ids"] == [ids[i] for i in val_idx] and set(data.meta["val_document_ids"]) < set(ids)
    assert (data.meta["splits"]["val"]["documents"], data.meta["source"]["type"]) == (len(val_idx), "shakespeare")


def test_block_size_check_names_the_split_and_the_fix(files_cfg):
    data = prepare_data(files_cfg, progress=False)
    data.check_block_size(8)
    with pytest.raises(DataError, match=r"fewer than one block.*block_size"):
        data.check_block_size(len(data.val_tokens()))


# b.txt and c.txt are the validation split of val_fraction 0.3 and split_seed 1.
@pytest.mark.parametrize("contents, message", [
    ({"0.txt": "", "1.txt": "", "2.txt": ""}, "corpus is empty"),
    ({"0.txt": "only one document"}, "at least 2"),
    ({"a.txt": "some text here", "b.txt": "", "c.txt": ""}, "validation split .* holds no text"),
])
def test_bad_corpora_fail_cleanly(tmp_path, contents, message):
    assert hash_split(["a.txt", "b.txt", "c.txt"], 0.3, seed=1)[1] == [1, 2]
    folder = tmp_path / "c"
    folder.mkdir()
    for name, text in contents.items():
        (folder / name).write_text(text, encoding="utf-8")
    cfg = _folder_cfg(tmp_path, folder, val_fraction=0.3, split_seed=1)
    with pytest.raises(DataError, match=message):
        prepare_data(cfg, progress=False)
    assert cache_contents(cfg) == []


def test_unknown_source_and_unwritable_cache_dir(tmp_path, files_cfg):
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"))
    cfg.source = "web"  # slipped past the config check, e.g. set after loading
    with pytest.raises(DataError, match="unknown data.source 'web'"):
        prepare_data(cfg, progress=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    with pytest.raises(DataError, match="cannot write to data.cache_dir"):
        prepare_data(files_cfg.model_copy(update=dict(cache_dir=str(blocker))), progress=False)


def test_a_full_disk_under_the_cache_names_the_entry_and_the_cause(tmp_path, mount_tmpfs):
    # numpy's tofile reported a short write with no errno, so the error read "a file: OSError".
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, text in enumerate(make_documents(400)):  # token files far larger than the disk
        (folder / f"doc{i:03d}.txt").write_text(text, encoding="utf-8")
    disk = mount_tmpfs(64 * 1024)
    cfg = _folder_cfg(tmp_path, folder).model_copy(update=dict(cache_dir=str(disk / "cache")))
    with pytest.raises(OSError) as full:
        prepare_data(cfg, progress=False)
    assert full.value.errno == errno.ENOSPC and full.value.filename == str(entry_dir(cfg))
    assert describe_os_error(full.value) == (f"{entry_dir(cfg)}: No space left on device; the disk is full; free "
                                             "space on it or choose a directory on another disk")
    assert os.listdir(disk / "cache") == []  # nothing half-written left behind


def _same_size_garbage(data, fill: int | None = None) -> None:
    count = data.train_path.stat().st_size // np.dtype(data.dtype).itemsize
    random = np.random.default_rng(0).integers(0, data.vocab_size, count)
    (np.full(count, fill) if fill is not None else random).astype(data.dtype).tofile(data.train_path)


def _edit_meta(data, edit) -> None:
    meta = json.loads((data.directory / "meta.json").read_text())
    edit(meta)
    (data.directory / "meta.json").write_text(json.dumps(meta))


def _one_past_the_vocabulary_with_its_checksum(data) -> None:
    ids = np.array(data.val_tokens())
    ids[-1] = data.vocab_size
    ids.tofile(data.val_path)
    _edit_meta(data, lambda meta: meta["splits"]["val"].update(sha256=digest_token_file(data.val_path, data.dtype).sha256))


def test_recorded_digest_equals_a_fresh_read(files_cfg):
    data = prepare_data(files_cfg, progress=False)
    for split, path in (("train", data.train_path), ("val", data.val_path)):
        recorded = data.meta["splits"][split]
        found = digest_token_file(path, data.dtype)
        assert (found.sha256, found.max_id) == (recorded["sha256"], recorded["max_id"])
        assert found.max_id == int(np.array(np.memmap(path, dtype=data.dtype, mode="r")).max())


# Chat preparation in the same cache
BLOCK_SIZE = 64


@pytest.fixture
def chat_setup(tmp_path: Path, tokenizer) -> tuple[DataConfig, Path]:
    """(config, tokenizer file): 40 short conversations as JSONL, and a tokenizer with the chat tokens."""
    rows = [{"messages": [{"role": "user", "content": f"question {i}: {text[:60]}"},
                          {"role": "assistant", "content": f"answer {i}: {text[60:120]}"}]}
            for i, text in enumerate(make_documents(40))]
    corpus = tmp_path / "chats.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tokenizer_file = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_file))
    cfg = DataConfig(source="files", format="chat", cache_dir=str(tmp_path / "cache"),
                     files=FilesSourceConfig(paths=[str(corpus)]))
    return cfg, tokenizer_file


def _prepare(setup: tuple[DataConfig, Path], **kwargs) -> PreparedChat:
    cfg, tokenizer_file = setup
    return prepare_chat_data(cfg, tokenizer_file, BLOCK_SIZE, progress=False, **kwargs)


def _arrays(data: PreparedData | PreparedChat) -> list[np.ndarray]:
    if isinstance(data, PreparedData):
        return [np.array(data.train_tokens()), np.array(data.val_tokens())]
    return [np.array(a) for split in (data.train, data.val) for a in (split.ids, split.mask, split.offsets)]


def test_a_chat_entry_is_reused_without_reading_the_conversations(chat_setup, monkeypatch):
    first = _prepare(chat_setup)
    assert len(first.train) > 0 and len(first.val) > 0
    assert first.train.offsets[-1] == len(first.train.ids) == first.meta["splits"]["train"]["tokens"]

    monkeypatch.setattr(chat_module, "load_conversations", lambda *a, **k: pytest.fail("read them again"))
    second = _prepare(chat_setup)
    assert second.directory == first.directory and second.meta == first.meta
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(first), _arrays(second)))
    assert cache_contents(chat_setup[0]) == [first.directory.name]


def _conversations(data: PreparedChat) -> Path:
    return data.directory / chat_module.CONVERSATIONS_FILE


def _overwritten_same_size(data: PreparedChat) -> None:
    raw = bytearray(_conversations(data).read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 16] = bytes(b ^ 0xFF for b in raw[middle : middle + 16])  # np.load still reads it
    _conversations(data).write_bytes(bytes(raw))


# A damage to a text or a chat entry, and the part of the message that refuses it.
REBUILD = "delete that cache entry"
DAMAGES = {
    "truncated": ("text", lambda data: os.truncate(data.train_path, 10), "truncated"),
    "random_in_range": ("text", _same_size_garbage, REBUILD),
    "all_ff": ("text", lambda data: _same_size_garbage(data, fill=np.iinfo(data.dtype).max), REBUILD),
    "meta_is_a_list": ("text", lambda data: (data.directory / "meta.json").write_text("[]"), REBUILD),
    "meta_lost_checksum": ("text", lambda data: _edit_meta(data, lambda meta: meta["splits"]["train"].pop("sha256")),
                           REBUILD),
    "out_of_range_with_a_matching_checksum": ("text", _one_past_the_vocabulary_with_its_checksum,
                                              "token id 300, beyond the vocabulary"),
    "chat-truncated": ("chat", lambda data: os.truncate(_conversations(data), _conversations(data).stat().st_size // 2),
                       REBUILD),
    "chat-overwritten_same_size": ("chat", _overwritten_same_size, REBUILD),
    "chat-meta_is_a_list": ("chat", lambda data: (data.directory / "meta.json").write_text("[]"), REBUILD),
    "chat-meta_lost_checksum": ("chat", lambda data: _edit_meta(data, lambda meta: meta.pop("conversations_sha256")),
                                REBUILD),
}


@pytest.mark.parametrize("kind, damage, fragment", DAMAGES.values(), ids=DAMAGES, indirect=["kind"])
def test_a_damaged_entry_is_refused_then_rebuilt_equal(kind, chat_setup, damage, fragment):
    cfg, _, _, prepare, _ = kind
    original = prepare()
    before = _arrays(original)
    damage(original)
    with pytest.raises(DataError, match=fragment):
        if cfg.format == "chat":
            PreparedChat.open(original.directory, chat_setup[1])
        else:
            PreparedData.open(original.directory)
    rebuilt = prepare()
    assert rebuilt.directory == original.directory and cache_contents(cfg) == [rebuilt.directory.name]
    assert all(np.array_equal(a, b) for a, b in zip(before, _arrays(rebuilt)))


def test_a_chat_build_that_loses_the_race_to_publish_takes_the_winners_entry(chat_setup, monkeypatch):
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


# Text and chat alike: (config, module, its step a failure interrupts, prepare, a damage a waiter must not take)
@pytest.fixture(params=["text", "chat"])
def kind(request, files_cfg, chat_setup):
    if request.param == "text":
        return files_cfg, prepare_module, "_write_tokens", functools.partial(prepare_data, files_cfg, progress=False), \
            _same_size_garbage
    return chat_setup[0], chat_module, "tokenize_conversations", functools.partial(_prepare, chat_setup), \
        _overwritten_same_size


def test_a_failed_prepare_leaves_nothing_and_the_next_one_succeeds(kind, monkeypatch):
    cfg, module, step, prepare, _ = kind
    real, calls = getattr(module, step), []

    def crash_on_val(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the validation split's
            raise KeyboardInterrupt  # like Ctrl-C halfway through
        return real(*args, **kwargs)

    monkeypatch.setattr(module, step, crash_on_val)
    with pytest.raises(KeyboardInterrupt):
        prepare()
    assert cache_contents(cfg) == []
    monkeypatch.setattr(module, step, real)
    data = prepare()
    assert (len(data.val) if isinstance(data, PreparedChat) else data.val_tokens().size) > 0


def _wait_in_thread(prepare, results: dict[str, object]) -> threading.Thread:
    def worker() -> None:
        try:
            results["data"] = prepare(is_main=False, wait_timeout_s=120)
        except BaseException as exc:  # report in the main thread
            results["error"] = exc

    thread = threading.Thread(target=worker)
    thread.start()
    return thread


def test_other_processes_wait_for_the_main_one_even_past_a_damaged_entry(kind):
    _, _, _, prepare, damage = kind
    with pytest.raises(DataError, match="waited 0.2 s for the main process"):  # in one line, when it times out
        prepare(is_main=False, wait_timeout_s=0.2)
    results: dict[str, object] = {}
    thread = _wait_in_thread(prepare, results)
    time.sleep(0.3)
    assert not results  # nothing to return until the main process has prepared
    main = prepare()
    thread.join(timeout=120)
    assert "error" not in results and results["data"].directory == main.directory

    damage(main)
    results.clear()
    thread = _wait_in_thread(prepare, results)
    time.sleep(0.3)
    assert not results  # a damaged entry is not taken: the waiter keeps waiting
    rebuilt = prepare()
    thread.join(timeout=120)
    assert "error" not in results
    assert all(np.array_equal(a, b) for a, b in zip(_arrays(rebuilt), _arrays(results["data"])))
