"""Hub and local-file sources, exercised offline through the same `datasets.load_dataset` calls."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.config import DataConfig, FilesSourceConfig, HubSourceConfig
from data.errors import DataError
from data.prepared.text import prepare_data
from data.sources.corpus import load_source
from data_testkit import direct_tokens, make_documents


def _hub_dir(
    root: Path, train: list[str], val: list[str] | None, column: str = "text", ids: bool = False
) -> Path:
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


def _files_cfg(path: Path, **files) -> DataConfig:
    return DataConfig(source="files", files=FilesSourceConfig(paths=[str(path)], **files))


def _hub_cfg(tmp_path: Path, folder: Path, **hub) -> DataConfig:
    return DataConfig(source="hub", vocab_size=300, val_fraction=0.25, cache_dir=str(tmp_path / "cache"),
                      hub=HubSourceConfig(name=str(folder), **hub))


def test_hub_dataset_with_its_own_validation_split(tmp_path):
    train, val = make_documents(8, seed=1), make_documents(3, seed=2)
    data = prepare_data(_hub_cfg(tmp_path, _hub_dir(tmp_path, train, val)), progress=False)
    tok = data.tokenizer()
    assert data.train_tokens().tolist() == direct_tokens(tok, train)
    assert data.val_tokens().tolist() == direct_tokens(tok, val)
    assert data.meta["val_from"] == "split 'validation'"
    assert data.meta["val_document_ids"] == ["0", "1", "2"]


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
    one_doc_bytes = len(train[0].encode("utf-8"))
    cfg = _hub_cfg(tmp_path, folder, max_bytes=4 * one_doc_bytes, streaming=streaming)
    docs = load_source(cfg, progress=False)
    assert 2 <= len(docs.train) <= 4 and list(docs.train["text"]) == train[: len(docs.train)]


def test_hub_empty_validation_split_is_a_clear_error(tmp_path):
    folder = _hub_dir(tmp_path, make_documents(6), ["", ""])
    with pytest.raises(DataError, match="validation split .*'validation'.* holds no text.*val_split: null"):
        prepare_data(_hub_cfg(tmp_path, folder), progress=False)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
    data = prepare_data(_hub_cfg(tmp_path, folder, val_split=None), progress=False)
    assert data.meta["val_from"].startswith("hash")


def test_hub_text_column_is_configurable_and_a_missing_one_is_named(tmp_path):
    folder = _hub_dir(tmp_path, make_documents(6), make_documents(2, seed=9), column="story")
    with pytest.raises(DataError, match=r"no column 'text' \(columns: story, n\).*data.hub.text_column"):
        prepare_data(_hub_cfg(tmp_path, folder), progress=False)
    data = prepare_data(_hub_cfg(tmp_path, folder, text_column="story"), progress=False)
    assert data.meta["splits"]["val"]["documents"] == 2
    with pytest.raises(DataError, match="'n' .* holds int64, not text"):
        prepare_data(_hub_cfg(tmp_path, folder, text_column="n"), progress=False)


def test_hub_unreachable_says_offline_and_how_to_use_local_files(tmp_path):
    hub = HubSourceConfig(name="roneneldan/TinyStories")
    cfg = DataConfig(source="hub", cache_dir=str(tmp_path / "cache"), hub=hub)
    with pytest.raises(DataError) as err:
        prepare_data(cfg, progress=False)
    message = str(err.value)
    assert "offline" in message and "local" in message and "roneneldan/TinyStories" in message
    assert "\n" not in message
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_hub_missing_local_directory_or_split(tmp_path):
    with pytest.raises(DataError, match="not found"):
        prepare_data(_hub_cfg(tmp_path, tmp_path / "nowhere"), progress=False)
    folder = _hub_dir(tmp_path, make_documents(4), None)
    with pytest.raises(DataError, match="no split 'training'.*data.hub.train_split"):
        prepare_data(_hub_cfg(tmp_path, folder, train_split="training"), progress=False)


def test_txt_files_are_one_document_per_file_named_by_relative_path(tmp_path):
    layout = (("a", "x.txt", "first file\n"), ("b", "y.txt", "second\n\nfile"), ("b", "z.txt", "third"))
    for sub, name, text in layout:
        (tmp_path / "in" / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / sub / name).write_text(text, encoding="utf-8")
    cfg = DataConfig(source="files", files=FilesSourceConfig(paths=[str(tmp_path / "in" / "**" / "*.txt")]))
    docs = load_source(cfg, progress=False)
    assert docs.train_ids == ["a/x.txt", "b/y.txt", "b/z.txt"]
    assert list(docs.train["text"]) == ["first file\n", "second\n\nfile", "third"]
    cfg.files.txt_document = "paragraph"
    assert list(load_source(cfg, progress=False).train["text"]) == ["first file\n", "second", "file", "third"]


def test_jsonl_and_parquet_files(tmp_path):
    texts = make_documents(6, seed=6)
    jsonl = tmp_path / "corpus.jsonl"
    rows = [json.dumps({"body": t, "id": f"j{i}"}) + "\n" for i, t in enumerate(texts)]
    jsonl.write_text("".join(rows), encoding="utf-8")
    parquet = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": texts}), parquet)
    from_jsonl = load_source(_files_cfg(jsonl, text_column="body"), progress=False)
    assert list(from_jsonl.train["text"]) == texts and from_jsonl.train_ids == [f"j{i}" for i in range(6)]
    from_parquet = load_source(_files_cfg(parquet), progress=False)
    assert list(from_parquet.train["text"]) == texts and from_parquet.train_ids == [str(i) for i in range(6)]
    with pytest.raises(DataError, match=r"no column 'text' \(columns: body, id\)"):
        load_source(_files_cfg(jsonl), progress=False)


def test_non_utf8_file_is_named_unless_replacing(tmp_path):
    (tmp_path / "good.txt").write_text("fine text", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 latin-1")
    cfg = DataConfig(source="files", files=FilesSourceConfig(paths=[str(tmp_path / "*.txt")]))
    expected = r"bad\.txt is not valid UTF-8 \(byte 0xe9 at offset 3\).*encoding_errors: replace"
    with pytest.raises(DataError, match=expected):
        load_source(cfg, progress=False)
    cfg.files.encoding_errors = "replace"
    assert "caf\ufffd latin-1" in list(load_source(cfg, progress=False).train["text"])

    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_bytes(b'{"text": "caf\xe9"}\n{"text": "ok"}\n')
    cfg = DataConfig(source="files", files=FilesSourceConfig(paths=[str(bad_jsonl)]))
    with pytest.raises(DataError, match=r"bad\.jsonl is not valid UTF-8"):
        load_source(cfg, progress=False)
    cfg.files.encoding_errors = "replace"
    assert list(load_source(cfg, progress=False).train["text"]) == ["caf\ufffd", "ok"]


@pytest.mark.parametrize(
    "names, paths, message",
    [
        (["a.csv"], ["a.csv"], "cannot tell the format of .*a.csv.*data.files.format"),
        (["a.txt", "b.jsonl"], ["a.txt", "b.jsonl"], "mixes formats"),
        ([], ["*.txt"], r"no file matches '.*\*\.txt'"),
        ([], ["missing.txt"], "no such file"),
    ],
)
def test_bad_file_lists(tmp_path, names, paths, message):
    for name in names:
        (tmp_path / name).write_text("x", encoding="utf-8")
    cfg = DataConfig(source="files", cache_dir=str(tmp_path / "cache"),
                     files=FilesSourceConfig(paths=[str(tmp_path / p) for p in paths]))
    with pytest.raises(DataError, match=message):
        prepare_data(cfg, progress=False)
    assert not (tmp_path / "cache").exists()


def test_malformed_jsonl_is_a_one_line_error(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "ok"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(DataError, match="cannot read local jsonl files") as err:
        load_source(_files_cfg(path), progress=False)
    assert "\n" not in str(err.value)


def test_unreadable_hub_files_are_a_one_line_error(tmp_path):
    folder = _hub_dir(tmp_path, make_documents(4), None)
    (folder / "data" / "train-00000.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match="cannot load hub dataset") as err:
        prepare_data(_hub_cfg(tmp_path, folder), progress=False)
    assert "\n" not in str(err.value)
