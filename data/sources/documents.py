"""What every corpus source produces, the column and error helpers the sources share, and the
document-level train/validation split: by a seeded hash of each document's stable id, so adding a
document moves no other one. The one exception keeps tiny corpora usable: if one side would be
empty, the document whose hash is nearest the threshold moves across."""

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import DataError


@dataclass
class SourceDocuments:
    """A corpus read from its source: `datasets.Dataset`s with one "text" column, plus ids; `val` is
    the source's own validation split, or None (the caller then hashes `train`'s ids)."""

    description: str
    train: Any
    train_ids: list[str]
    val: Any | None = None
    val_ids: list[str] | None = None
    val_split: str | None = None  # name of the source's own validation split, when used


def validation_score(doc_id: str, seed: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, doc_id) (blake2b: Python's hash() is salted per
    process); below val_fraction means validation."""
    digest = hashlib.blake2b(f"{seed}\0{doc_id}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def hash_split(doc_ids: Sequence[str], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, validation indices) into `doc_ids`, both non-empty and in corpus order."""
    if len(doc_ids) < 2:
        raise DataError(
            f"the corpus has {len(doc_ids)} document(s); holding whole documents out for "
            "validation needs at least 2: add documents (e.g. .txt files, one document each, or "
            "data.files.txt_document: paragraph) or use a source with a validation split"
        )
    scores = [validation_score(doc_id, seed) for doc_id in doc_ids]
    is_val = [score < val_fraction for score in scores]
    if not any(is_val):
        is_val[min(range(len(scores)), key=scores.__getitem__)] = True
    elif all(is_val):
        is_val[max(range(len(scores)), key=scores.__getitem__)] = False
    return [i for i, v in enumerate(is_val) if not v], [i for i, v in enumerate(is_val) if v]


def check_text_column(dataset_or_row: Any, column: str, description: str, key: str) -> None:
    """The text column of a `datasets.Dataset` or of one row must exist and hold strings; if not,
    say which columns there are."""
    if isinstance(dataset_or_row, dict):
        columns, value = list(dataset_or_row), dataset_or_row.get(column)
        dtype = None if value is None or isinstance(value, str) else type(value).__name__
    else:
        columns = list(dataset_or_row.column_names or [])
        feature = (dataset_or_row.features or {}).get(column)
        dtype = getattr(feature, "dtype", type(feature).__name__)
        dtype = None if feature is None or dtype in ("string", "large_string") else dtype
    if column not in columns:
        raise DataError(
            f"{description} has no column {column!r} (columns: {', '.join(columns) or 'none'}): set {key}"
        )
    if dtype is not None:
        raise DataError(f"column {column!r} of {description} holds {dtype}, not text: set {key}")


def text_only(dataset: Any, column: str) -> Any:
    """The dataset reduced to its text column, named "text" (no data is copied)."""
    dataset = dataset.select_columns([column])
    return dataset if column == "text" else dataset.rename_column(column, "text")


def row_ids(dataset: Any) -> list[str]:
    """The dataset's own "id" column when it has one, else row numbers."""
    if "id" in (dataset.column_names or []):
        return [str(v) for v in dataset["id"]]
    return [str(i) for i in range(len(dataset))]


def file_identity(path: Path, root: Path) -> list[Any]:
    """A file's identity for a cache key: path below `root`, size and modification time."""
    stat = path.stat()
    return [str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns]


def find_cause(exc: BaseException, kind: type) -> BaseException | None:
    """The innermost exception of type `kind` in `exc`'s cause/context chain: `datasets` wraps the
    real failure in a generic "An error occurred while generating the dataset"."""
    found = None
    seen = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, kind):
            found = current
        current = current.__cause__ or current.__context__
    return found
