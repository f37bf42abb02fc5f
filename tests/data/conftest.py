"""Small corpora and configs shared by the data tests (kept tiny: the whole area runs in seconds)."""

from pathlib import Path

import pytest

from data.config import DataConfig, FilesSourceConfig
from data_testkit import make_documents


@pytest.fixture
def txt_corpus(tmp_path: Path) -> Path:
    """A folder of 12 .txt files, one document each."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, text in enumerate(make_documents(12)):
        (folder / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def files_cfg(tmp_path: Path, txt_corpus: Path) -> DataConfig:
    return DataConfig(
        source="files",
        vocab_size=300,
        val_fraction=0.25,
        cache_dir=str(tmp_path / "cache"),
        files=FilesSourceConfig(paths=[str(txt_corpus / "*.txt")]),
    )
