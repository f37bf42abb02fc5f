"""Local .txt, .jsonl and .parquet files as a corpus source, read with `datasets.load_dataset`. A
document is a row's text column, or for .txt a whole file (`txt_document`), its id the path below
the files' common folder; a row's id is its "id" column, else its row number."""

import bz2
import glob
import gzip
import json
import lzma
import os
from pathlib import Path
from typing import IO, Any

from common.errors import DataError, one_line
from data.config import DataConfig, FilesSourceConfig
from data.sources.documents import SourceDocuments, check_text_column, file_identity, find_cause, row_ids, text_only
from data.sources.rows import SourceRows, table_rows

_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".lz4")
_FORMAT_BY_SUFFIX = {
    ".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
    ".parquet": "parquet",
}
_BUILDER_BY_FORMAT = {"txt": "text", "jsonl": "json", "parquet": "parquet"}
_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_TXT_SAMPLE_BY = {"file": "document", "paragraph": "paragraph", "line": "line"}


def spec(cfg: DataConfig) -> dict[str, Any]:
    """What decides the documents, for the cache key: settings plus each file's size and mtime."""
    files_cfg = cfg.files
    files = resolve_files(files_cfg.paths)
    fmt = files_format(files, files_cfg.format)
    root = _common_root(files)
    return {
        "type": "files",
        "format": fmt,
        "text_column": files_cfg.text_column if fmt != "txt" else "text",
        "txt_document": files_cfg.txt_document if fmt == "txt" else None,
        "encoding_errors": files_cfg.encoding_errors,
        "root": str(root),
        "files": [file_identity(p, root) for p in files],
    }


def load(cfg: DataConfig, progress: bool) -> SourceDocuments:
    """Read the files into one `datasets.Dataset` (a training split; the caller hash-splits it)."""
    files_cfg = cfg.files
    files = resolve_files(files_cfg.paths)
    fmt = files_format(files, files_cfg.format)
    description = f"local {fmt} files ({len(files)} file{'s' if len(files) != 1 else ''})"
    dataset = load_files_dataset(files, fmt, files_cfg, description)
    text_column = "text" if fmt == "txt" else files_cfg.text_column
    check_text_column(dataset, text_column, description, "data.files.text_column")
    if fmt == "txt" and files_cfg.txt_document == "file" and len(dataset) == len(files):
        # One row per file, in the order given to load_dataset.
        root = _common_root(files)
        ids = [str(p.relative_to(root)) for p in files]
    else:
        ids = row_ids(dataset)
    return SourceDocuments(description, text_only(dataset, text_column), ids)


def load_files_dataset(files: list[Path], fmt: str, files_cfg: FilesSourceConfig, description: str) -> Any:
    """`files` (all of format `fmt`) as one `datasets.Dataset` with every column they hold."""
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    kwargs: dict[str, Any] = {}
    if fmt == "txt":
        kwargs["sample_by"] = _TXT_SAMPLE_BY[files_cfg.txt_document]
        kwargs["encoding_errors"] = files_cfg.encoding_errors
    elif fmt == "jsonl":
        # Spelled exactly "utf-8", the json builder hands raw bytes to Arrow, which stores invalid
        # UTF-8 without complaint (it only fails later, when the text is read). "utf_8" is the
        # same codec under another name, and makes the builder decode in Python first, honouring
        # encoding_errors.
        kwargs["encoding"] = "utf_8"
        kwargs["encoding_errors"] = files_cfg.encoding_errors
    try:
        return datasets.load_dataset(
            _BUILDER_BY_FORMAT[fmt], data_files=[str(p) for p in files], split="train", **kwargs
        )
    except Exception as exc:
        raise _file_read_error(exc, files, description) from exc


def resolve_files(patterns: list[str]) -> list[Path]:
    """Expand paths and globs into a sorted, de-duplicated list of existing files."""
    found: list[Path] = []
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if any(char in expanded for char in "*?["):
            matches = [Path(m) for m in sorted(glob.glob(expanded, recursive=True)) if os.path.isfile(m)]
            if not matches:
                raise DataError(f"data.files.paths: no file matches {pattern!r}")
            found.extend(matches)
        elif os.path.isfile(expanded):
            found.append(Path(expanded))
        else:
            raise DataError(f"data.files.paths: no such file {pattern!r}")
    return sorted({p.resolve() for p in found})


def files_format(files: list[Path], fmt: str) -> str:
    if fmt != "auto":
        return fmt
    formats = {_format_of(p) for p in files}
    if len(formats) > 1:
        raise DataError(
            f"data.files.paths mixes formats ({', '.join(sorted(formats))}): use one format per corpus"
        )
    return formats.pop()


def _format_of(path: Path) -> str:
    name = path.name.lower()
    for suffix in _COMPRESSION_SUFFIXES:
        name = name.removesuffix(suffix)
    fmt = _FORMAT_BY_SUFFIX.get(os.path.splitext(name)[1])
    if fmt is None:
        raise DataError(
            f"cannot tell the format of {path} from its extension: "
            "set data.files.format to txt, jsonl or parquet"
        )
    return fmt


def _common_root(files: list[Path]) -> Path:
    if len(files) == 1:
        return files[0].parent
    return Path(os.path.commonpath([str(p) for p in files]))


def _file_read_error(exc: BaseException, files: list[Path], description: str) -> DataError:
    if find_cause(exc, UnicodeDecodeError) is not None:
        where = _first_undecodable(files) or f"{description}: not valid UTF-8"
        fix = "fix the file, or set data.files.encoding_errors: replace (bad bytes become U+FFFD)"
        return DataError(f"{where}: {fix}")
    if description.startswith("local jsonl"):
        malformed = first_malformed_json_line(files)
        if malformed is not None:
            return DataError(f"cannot read {description}: {malformed}; each line must be one JSON object, fix or remove that line")
    cause = find_cause(exc, Exception) or exc
    return DataError(f"cannot read {description}: {one_line(cause)}; check the files and data.files.format")


def _first_undecodable(files: list[Path]) -> str | None:
    for path in files:
        with _open_binary(path) as f:
            data = f.read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as err:
            return f"file {path} is not valid UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start})"
    return None


def first_malformed_json_line(files: list[Path]) -> str | None:
    """'FILE line N: reason' for the first non-blank line that is not a JSON object, or None."""
    for path in files:
        with _open_binary(path) as f:
            for number, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                try:
                    value = json.loads(raw)
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    reason = e.msg if isinstance(e, json.JSONDecodeError) else "not valid UTF-8"
                    return f"{path} line {number}: {reason}"
                if not isinstance(value, dict):
                    return f"{path} line {number}: a JSON {type(value).__name__}, not an object"
    return None


def read_json_rows(path: Path, encoding_errors: str = "strict") -> SourceRows:
    """The JSON objects of a fine-tuning file, one per line, or the items of one JSON array. Read here
    rather than through ``datasets``, whose errors name neither the line nor what is wrong with it."""
    fix = "each line must hold one JSON object: fix or remove that line"
    placed: list[tuple[str, dict[str, Any]]] = []
    with _open_binary(path) as f:
        first = f.read(4096).lstrip()
    if first.startswith(b"["):  # one JSON array for the whole file, or a JSON Lines file whose first line is one
        array = _whole_array(path, encoding_errors)
        if array is not None:
            for i, value in enumerate(array, start=1):
                if not isinstance(value, dict):
                    raise DataError(f"{path} item {i}: a JSON {_json_type(value)}, not an object; make each item "
                                    "one object")
                placed.append((f"{path} item {i}", value))
            return table_rows(str(path), placed)
    lines = 0
    with _open_binary(path) as f:
        for lines, raw in enumerate(f, start=1):
            where = f"{path} line {lines}"
            try:
                text = raw.decode("utf-8", errors=encoding_errors)
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not valid UTF-8 (byte 0x{raw[e.start]:02x}, the line's byte {e.start + 1}); "
                                "fix the file, or set data.files.encoding_errors: replace (bad bytes become U+FFFD)") from None
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                ends_inside = e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string")
                cut = " (the line ends inside it: cut short?)" if ends_inside else ""
                reason = e.msg.removesuffix(" at")  # "Invalid control character at": the column follows
                raise DataError(f"{where}: not one whole JSON object ({reason} at column {e.colno}{cut}); "
                                f"{fix}") from None
            if isinstance(value, list):
                raise DataError(f"{where}: a JSON array, not an object; write each row as one object on a line of "
                                "its own (JSON Lines), not a list of them")
            if not isinstance(value, dict):
                raise DataError(f"{where}: a JSON {_json_type(value)}, not an object; {fix}")
            placed.append((where, value))
    if not placed:
        what = "is empty" if lines == 0 else f"has only blank lines ({lines})"
        raise DataError(f"{path} {what}: write one JSON object per line, or remove it from data.files.paths")
    return table_rows(str(path), placed)


def _open_binary(path: Path) -> IO[bytes]:
    return _OPENERS.get(path.suffix.lower(), open)(path, "rb")


def _whole_array(path: Path, encoding_errors: str) -> list[Any] | None:
    """The file as one JSON array, or None when it is not one (JSON Lines, then, read line by line)."""
    with _open_binary(path) as f:
        data = f.read()
    try:
        value = json.loads(data.decode("utf-8", errors=encoding_errors))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, list) else None


def _json_type(value: Any) -> str:
    names = {str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), "value")
