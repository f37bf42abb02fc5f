"""Small corpora and configs shared by the data tests (kept tiny: the whole area runs in seconds)."""

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from data.config import DataConfig, FilesSourceConfig
from data.tokenizer import train_tokenizer
from data_testkit import make_documents


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """A tokenizer of 400 ids trained on 40 documents, with the chat and tool tokens (tests do not change it)."""
    return train_tokenizer(make_documents(40), 400)


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
