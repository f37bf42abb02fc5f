"""What every corpus source produces, and the column and error helpers the sources share."""

from __future__ import annotations

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
