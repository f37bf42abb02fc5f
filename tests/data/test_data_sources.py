"""Hub and local-file sources, exercised offline through the same `datasets.load_dataset` calls; a source
that cannot be read (a malformed .jsonl line named by file and line among them) is one line; an unreachable
hub is named as a network problem at once, with the offline alternatives, instead of after tens of seconds
of retries or as a 'dataset not found'."""

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import data.sources.hub as hub
from common.errors import DataError
from data.config import DataConfig, FilesSourceConfig, HubSourceConfig
from data.prepared.text import prepare_data
from data.sources.corpus import load_source
from data.sources.hub import check_hub_reachable
from data_testkit import direct_tokens, make_documents


def _hub_dir(root: Path, train: list[str], val: list[str] | None, column: str = "text", ids: bool = False) -> Path:
    """A local directory laid out like a hub dataset: data/<split>-00000.parquet."""
    folder = root / "hub_dataset"
    (folder / "data").mkdir(parents=True)
    for split, texts in (("train", train), ("validation", val)):
        if texts is not None:
            columns = {column: pa.array(texts, pa.string()), "n": pa.array(range(len(texts)), pa.int64())}
            if ids:
                columns["id"] = [f"{split}-doc-{i}" for i in range(len(texts))]
            pq.write_table(pa.table(columns), folder / "data" / f"{split}-00000.parquet")
    return folder


def _hub_cfg(tmp_path: Path, folder: Path, **hub) -> DataConfig:
    return DataConfig(source="hub", vocab_size=300, val_fraction=0.25, cache_dir=str(tmp_path / "cache"),
                      hub=HubSourceConfig(name=str(folder), **hub))


def test_hub_dataset_with_its_own_validation_split(tmp_path):
    train, val = make_documents(8, seed=1), make_documents(3, seed=2)
    data = prepare_data(_hub_cfg(tmp_path, _hub_dir(tmp_path, train, val)), progress=False)
    tok = data.tokenizer()
    assert data.train_tokens().tolist() == direct_tokens(tok, train)
    assert data.val_tokens().tolist() == direct_tokens(tok, val)
    assert (data.meta["val_from"], data.meta["val_document_ids"]) == ("split 'validation'", ["0", "1", "2"])


def test_hub_dataset_without_validation_split_is_hash_split_by_its_id_column(tmp_path):
    train = make_documents(12, seed=3)
    data = prepare_data(_hub_cfg(tmp_path, _hub_dir(tmp_path, train, None, ids=True)), progress=False)
    held_out = data.meta["val_document_ids"]
    assert held_out and all(i.startswith("train-doc-") for i in held_out)
    val_texts = [train[int(i.rsplit("-", 1)[1])] for i in held_out]
    assert data.val_tokens().tolist() == direct_tokens(data.tokenizer(), val_texts)


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_limits_take_leading_whole_documents(tmp_path, streaming):
    train, val = make_documents(20, seed=4), make_documents(10, seed=5)
    folder = _hub_dir(tmp_path, train, val)
    docs = load_source(_hub_cfg(tmp_path, folder, max_documents=8, streaming=streaming), progress=False)
    # A budget of 8 documents: val_fraction (0.25) of it for the validation split.
    assert list(docs.train["text"]) == train[:6] and list(docs.val["text"]) == val[:2]
    cfg = _hub_cfg(tmp_path, folder, max_bytes=4 * len(train[0].encode("utf-8")), streaming=streaming)
    docs = load_source(cfg, progress=False)
    assert 2 <= len(docs.train) <= 4 and list(docs.train["text"]) == train[: len(docs.train)]


def test_hub_settings_that_name_a_missing_split_or_column_can_be_fixed(tmp_path):
    folder = _hub_dir(tmp_path, make_documents(6), ["", ""], column="story")
    data = prepare_data(_hub_cfg(tmp_path, folder, val_split=None, text_column="story"), progress=False)
    assert data.meta["val_from"].startswith("hash") and data.meta["splits"]["val"]["documents"] >= 1


def test_txt_files_are_one_document_per_file_named_by_relative_path(tmp_path):
    layout = (("a", "x.txt", "first file\n"), ("b", "y.txt", "second\n\nfile"), ("b", "z.txt", "third"))
    for sub, name, text in layout:
        (tmp_path / "in" / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / sub / name).write_text(text, encoding="utf-8")
    cfg = _files(tmp_path, {}, ["in/**/*.txt"])
    docs = load_source(cfg, progress=False)
    assert docs.train_ids == ["a/x.txt", "b/y.txt", "b/z.txt"]
    assert list(docs.train["text"]) == ["first file\n", "second\n\nfile", "third"]
    cfg.files.txt_document = "paragraph"
    assert list(load_source(cfg, progress=False).train["text"]) == ["first file\n", "second", "file", "third"]


def test_jsonl_and_parquet_files(tmp_path):
    texts = make_documents(6, seed=6)
    rows = "".join(json.dumps({"body": t, "id": f"j{i}"}) + "\n" for i, t in enumerate(texts))
    from_jsonl = load_source(_files(tmp_path, {"corpus.jsonl": rows}, text_column="body"), progress=False)
    assert list(from_jsonl.train["text"]) == texts and from_jsonl.train_ids == [f"j{i}" for i in range(6)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "corpus.parquet")
    from_parquet = load_source(_files(tmp_path, {}, ["corpus.parquet"]), progress=False)
    assert list(from_parquet.train["text"]) == texts and from_parquet.train_ids == [str(i) for i in range(6)]


def test_non_utf8_bytes_are_replaced_when_asked(tmp_path):
    for name, content, expected in (("bad.txt", b"caf\xe9 latin-1", ["caf\ufffd latin-1"]),
                                    ("bad.jsonl", b'{"text": "caf\xe9"}\n{"text": "ok"}\n', ["caf\ufffd", "ok"])):
        cfg = _files(tmp_path, {name: content}, encoding_errors="replace")
        assert list(load_source(cfg, progress=False).train["text"]) == expected


def _files(tmp_path: Path, contents: dict[str, str | bytes], paths: list[str] | None = None, **files) -> DataConfig:
    """A files source over ``contents`` written into tmp_path (``paths``: its globs, or every file)."""
    for name, content in contents.items():
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    globs = [str(tmp_path / p) for p in (paths if paths is not None else contents)]
    return DataConfig(source="files", vocab_size=300, cache_dir=str(tmp_path / "cache"),
                      files=FilesSourceConfig(paths=globs, **files))


def _hub(tmp_path: Path, train: list[str] | None = None, val: list[str] | None = None, column: str = "text",
         **hub) -> DataConfig:
    folder = _hub_dir(tmp_path, train or make_documents(6), val, column=column)
    return _hub_cfg(tmp_path, folder, **hub)


def _script_dir(tmp_path: Path) -> DataConfig:
    folder = tmp_path / "my_corpus"
    folder.mkdir()
    (folder / "my_corpus.py").write_text("import datasets\n")
    (folder / "train.jsonl").write_text('{"text": "hello"}\n')
    return _hub_cfg(tmp_path, folder)


def _unreadable_parquet(tmp_path: Path) -> DataConfig:
    cfg = _hub(tmp_path)
    (Path(cfg.hub.name) / "data" / "train-00000.parquet").write_bytes(b"not parquet at all")
    return cfg


# A .jsonl file whose fourth line (after a blank one) is malformed, and the reason its refusal gives.
GOOD_LINES = '{"text": "ok"}\n\n{"text": "also ok"}\n'
MALFORMED_LINES = [('{"text": broken', "Expecting value"), ("[1, 2]", "a JSON list, not an object"),
                   ('"text"', "a JSON str")]


# Each source refusal: one line naming the problem and its fix, before anything is cached.
@pytest.mark.parametrize("make_cfg, fragment", [
    (lambda tmp: _hub(tmp, val=["", ""]), r"validation split .*'validation'.* holds no text.*val_split: null"),
    (lambda tmp: _hub(tmp, val=make_documents(2), column="story"),
     r"no column 'text' \(columns: story, n\).*data.hub.text_column"),
    (lambda tmp: _hub(tmp, val=make_documents(2), text_column="n"), "'n' .* holds int64, not text"),
    (lambda tmp: _hub_cfg(tmp, tmp / "nowhere"), "not found"),
    (lambda tmp: _hub(tmp, train_split="training"), "no split 'training'.*data.hub.train_split"),
    (_unreadable_parquet, "cannot load hub dataset"),
    (_script_dir, "has a loading script .*my_corpus.py.*data.source: files"),
    (lambda tmp: DataConfig(source="hub", cache_dir=str(tmp / "cache"), hub=HubSourceConfig(name="roneneldan/TinyStories")),
     "offline.*roneneldan/TinyStories.*local"),
    (lambda tmp: _files(tmp, {"a.jsonl": '{"body": "x", "id": 1}\n'}), r"no column 'text' \(columns: body, id\)"),
    (lambda tmp: _files(tmp, {"good.txt": "fine text", "bad.txt": b"caf\xe9 latin-1"}, ["*.txt"]),
     r"bad\.txt is not valid UTF-8 \(byte 0xe9 at offset 3\).*encoding_errors: replace"),
    (lambda tmp: _files(tmp, {"bad.jsonl": b'{"text": "caf\xe9"}\n{"text": "ok"}\n'}), r"bad\.jsonl is not valid UTF-8"),
    (lambda tmp: _files(tmp, {"a.csv": "x"}), "cannot tell the format of .*a.csv.*data.files.format"),
    (lambda tmp: _files(tmp, {"a.txt": "x", "b.jsonl": "x"}), "mixes formats"),
    (lambda tmp: _files(tmp, {}, ["*.txt"]), r"no file matches '.*\*\.txt'"),
    (lambda tmp: _files(tmp, {}, ["missing.txt"]), "no such file"),
    *[(lambda tmp, bad=bad: _files(tmp, {"a.jsonl": '{"text": "fine"}\n' * 3, "b.jsonl": GOOD_LINES + bad + "\n"}),
       rf"^cannot read local jsonl files.*b\.jsonl line 4: .*{reason}") for bad, reason in MALFORMED_LINES],
], ids=["hub-empty-validation", "hub-no-text-column", "hub-column-not-text", "hub-no-folder", "hub-no-split",
        "hub-unreadable-parquet", "hub-loading-script", "hub-offline", "jsonl-no-text-column", "txt-not-utf8",
        "jsonl-not-utf8", "unknown-format", "mixed-formats", "no-match", "no-such-file", "jsonl-broken-line",
        "jsonl-list-line", "jsonl-string-line"])
def test_a_source_that_cannot_be_read_is_one_line_before_anything_is_cached(tmp_path, make_cfg, fragment):
    cfg = make_cfg(tmp_path)
    with pytest.raises(DataError, match=fragment) as info:
        prepare_data(cfg, progress=False)
    assert "\n" not in str(info.value) and not list((tmp_path / "cache").glob("*"))  # nothing cached


REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections are refused


def test_train_with_an_unreachable_hub_is_one_line_naming_the_network(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0",
           "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}", "OMP_NUM_THREADS": "1"}
    args = ["--set", "data.source=hub", "--set", "data.hub.name=someone/some-corpus",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", f"run.out_dir={tmp_path / 'run'}",
            "--set", "logging.wandb.mode=disabled", "--no-progress"]
    proc = subprocess.run([sys.executable, "train.py", "--config", "configs/tiny.yaml", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "a network problem" in lines[0] and "not a missing dataset" in lines[0]
    assert "data.source: files" in lines[0] and "hf download" in lines[0]


def test_a_hub_that_never_answers_is_given_up_on_after_the_timeout(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    release = threading.Event()

    def never_answers(*args, **kwargs):
        release.wait(30)
        raise OSError("released by the test")  # like a late refusal; the probe has given up by then

    monkeypatch.setattr(hub.socket, "create_connection", never_answers)
    try:
        with pytest.raises(ConnectionError, match="no answer from huggingface.co:443 within 0.2 s"):
            check_hub_reachable("someone/some-corpus", timeout_s=0.2)
    finally:
        release.set()  # the probe's thread ends now, not in the middle of a later test


def test_local_directories_and_offline_mode_are_not_probed(monkeypatch, tmp_path):
    monkeypatch.setattr(hub.socket, "create_connection", lambda *a, **k: pytest.fail("probed the network"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    check_hub_reachable(str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_hub_reachable("someone/some-corpus")
