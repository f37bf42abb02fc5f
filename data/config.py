"""The `data:` section of a run config, as typed dataclasses validated on construction.

A bad value raises `DataError` naming the key and what to write instead, so a typo in YAML fails
before any corpus is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from data.errors import DataError

SOURCES = ("shakespeare", "hub", "files")
FILE_FORMATS = ("auto", "txt", "jsonl", "parquet")
TXT_DOCUMENTS = ("file", "paragraph", "line")
ENCODING_ERRORS = ("strict", "replace")


@dataclass
class HubSourceConfig:
    """A dataset on the Hugging Face hub, or a local directory laid out like one.

    `max_documents` / `max_bytes` cap the corpus (whole documents, taken in order until the cap is
    reached). When the dataset has its own `val_split`, `val_fraction` of each cap goes to it and
    the rest to `train_split`; otherwise the capped `train_split` is hash-split like any corpus.
    """

    name: str = ""
    config_name: str | None = None
    train_split: str = "train"
    val_split: str | None = "validation"
    text_column: str = "text"
    streaming: bool = False
    max_documents: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_type("data.hub.name", self.name, str)
        _check_type("data.hub.config_name", self.config_name, str, optional=True)
        _check_type("data.hub.train_split", self.train_split, str)
        _check_type("data.hub.val_split", self.val_split, str, optional=True)
        _check_type("data.hub.text_column", self.text_column, str)
        _check_type("data.hub.streaming", self.streaming, bool)
        for key in ("max_documents", "max_bytes"):
            value = getattr(self, key)
            _check_type(f"data.hub.{key}", value, int, optional=True)
            if value is not None and value < 1:
                raise DataError(f"data.hub.{key} must be a positive integer or null, got {value}")
        if self.streaming and self.max_documents is None and self.max_bytes is None:
            raise DataError(
                "data.hub.streaming reads a slice of a large corpus: set data.hub.max_documents "
                "or data.hub.max_bytes (or set data.hub.streaming: false)"
            )


@dataclass
class FilesSourceConfig:
    """Local .txt / .jsonl / .parquet files (paths or globs, optionally .gz/.bz2/.xz/.zst).

    A .txt document is one whole file by default (`txt_document: file`); `paragraph` makes each
    blank-line separated block a document and `line` each line.
    """

    paths: list[str] = field(default_factory=list)
    format: str = "auto"
    text_column: str = "text"
    encoding_errors: str = "strict"
    txt_document: str = "file"

    def __post_init__(self) -> None:
        if isinstance(self.paths, str):
            raise DataError("data.files.paths must be a list of paths or globs, e.g. [corpus/*.txt]")
        _check_type("data.files.paths", self.paths, list)
        for path in self.paths:
            _check_type("data.files.paths[]", path, str)
        _check_choice("data.files.format", self.format, FILE_FORMATS)
        _check_type("data.files.text_column", self.text_column, str)
        _check_choice("data.files.encoding_errors", self.encoding_errors, ENCODING_ERRORS)
        _check_choice("data.files.txt_document", self.txt_document, TXT_DOCUMENTS)


@dataclass
class DataConfig:
    """Where the corpus comes from, how it is split, and the tokenizer trained on it."""

    source: str = "shakespeare"
    vocab_size: int = 2048
    val_fraction: float = 0.1
    split_seed: int = 1234
    cache_dir: str = "data_cache"
    hub: HubSourceConfig = field(default_factory=HubSourceConfig)
    files: FilesSourceConfig = field(default_factory=FilesSourceConfig)
    # Documents handed to one encode_batch call: large enough to keep every core busy, small
    # enough that a batch of long documents stays well inside memory.
    tokenize_batch_size: int = 1024

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise DataError(
                f"unknown data.source {self.source!r}: use one of {', '.join(SOURCES)}"
            )
        _check_type("data.vocab_size", self.vocab_size, int)
        # 256 byte symbols + the end-of-text token is the smallest byte-level vocabulary; uint32
        # token files cap it far above anything trained here.
        if not 257 <= self.vocab_size <= 2**32 - 1:
            raise DataError(f"data.vocab_size must be at least 257, got {self.vocab_size}")
        _check_type("data.val_fraction", self.val_fraction, float)
        if not 0.0 < self.val_fraction < 1.0:
            raise DataError(
                f"data.val_fraction must be between 0 and 1 (exclusive), got {self.val_fraction}"
            )
        _check_type("data.split_seed", self.split_seed, int)
        _check_type("data.cache_dir", self.cache_dir, str)
        if not self.cache_dir:
            raise DataError("data.cache_dir must not be empty; e.g. data_cache")
        _check_type("data.tokenize_batch_size", self.tokenize_batch_size, int)
        if self.tokenize_batch_size < 1:
            raise DataError("data.tokenize_batch_size must be a positive integer")
        _check_type("data.hub", self.hub, HubSourceConfig)
        _check_type("data.files", self.files, FilesSourceConfig)
        if self.source == "hub" and not self.hub.name:
            raise DataError(
                "data.source is 'hub' but data.hub.name is empty: set it to a hub dataset "
                "(e.g. roneneldan/TinyStories) or a local dataset directory"
            )
        if self.source == "files" and not self.files.paths:
            raise DataError(
                "data.source is 'files' but data.files.paths is empty: list .txt, .jsonl or "
                ".parquet paths or globs"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataConfig:
        """Build from a plain dict (e.g. parsed YAML); unknown keys are errors, not ignored."""
        d = dict(d)
        _reject_unknown("data", d, cls)
        if isinstance(d.get("hub"), dict):
            _reject_unknown("data.hub", d["hub"], HubSourceConfig)
            d["hub"] = HubSourceConfig(**d["hub"])
        if isinstance(d.get("files"), dict):
            _reject_unknown("data.files", d["files"], FilesSourceConfig)
            d["files"] = FilesSourceConfig(**d["files"])
        return cls(**d)


def _reject_unknown(section: str, d: dict[str, Any], cls: type) -> None:
    known = [f.name for f in dataclasses.fields(cls)]
    for key in d:
        if key not in known:
            raise DataError(f"unknown key {section}.{key}: valid keys are {', '.join(known)}")


def _check_type(key: str, value: Any, kind: type, optional: bool = False) -> None:
    if value is None and optional:
        return
    # bool is an int subclass; a YAML `true` where a number belongs is a mistake, not 1.
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        wanted = kind.__name__ + (" or null" if optional else "")
        raise DataError(f"{key} must be {wanted}, got {value!r}")


def _check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise DataError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
