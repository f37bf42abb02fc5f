"""Rows of a fine-tuning file or dataset split, each with the place an error about it names, as the
user finds it: ``FILE line 4`` (1-based, as an editor shows it), ``FILE item 4`` for one JSON array,
``DESCRIPTION row 4`` for parquet or a hub dataset. Every row has every column, a missing one None."""

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from data.sources.documents import row_ids


@dataclass
class SourceRows:
    """The rows of one file or dataset split."""

    description: str  # the file or dataset, for errors about all of it
    columns: list[str]
    rows: Iterable[tuple[str, dict[str, Any]]]  # (where, row), in order
    ids: list[str]  # each row's stable id, for the held-out split: its "id" column, else its row number


def dataset_rows(dataset: Any, description: str) -> SourceRows:
    """A ``datasets.Dataset``'s rows, read one at a time, each named by its 1-based row."""

    def numbered() -> Iterator[tuple[str, dict[str, Any]]]:
        for i, row in enumerate(dataset, start=1):
            yield f"{description} row {i}", row

    return SourceRows(description, list(dataset.column_names or []), numbered(), row_ids(dataset))


def table_rows(description: str, placed: list[tuple[str, dict[str, Any]]]) -> SourceRows:
    """Rows read as JSON objects, given every column any of them has (a missing one as None), and
    ids as a table of them has: the "id" column when there is one, else the row's number."""
    columns = list(dict.fromkeys(key for _, row in placed for key in row))
    rows = [(where, {column: row.get(column) for column in columns}) for where, row in placed]
    ids = [str(row["id"]) for _, row in rows] if "id" in columns else [str(i) for i in range(len(rows))]
    return SourceRows(description, columns, rows, ids)
