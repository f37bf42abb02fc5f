"""Read an offline wandb run back from disk, so tests can check what actually reached W&B.

An offline run is a directory ``<dir>/wandb/offline-run-<time>-<id>/`` holding ``run-<id>.wandb``
(the record stream wandb sync would upload) and ``files/`` (media such as tables). The stream is
a LevelDB-style log, as written by the wandb-core service:

- a 7-byte header: ``:W&B``, magic 0xBEE1 (little-endian), version 0;
- then 32 KiB blocks of chunks, each ``crc32 (4, LE) | length (2, LE) | type (1) | data``,
  where type is FULL=1, FIRST=2, MIDDLE=3, LAST=4 (a record larger than what is left of a
  block is split), the CRC is zlib's crc32 of the type byte followed by the data, and a block
  tail too short for a chunk header is zero padding;
- each reassembled record is a ``wandb.proto.wandb_internal_pb2.Record`` protobuf.

Other tests import this as ``from tests.tracking.wandb_records import read_offline_runs``.
"""

import glob
import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

_MAGIC = b":W&B"
_HEADER_SIZE = 7
_BLOCK_SIZE = 32 * 1024
_CHUNK_HEADER = struct.Struct("<IHB")
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """What one offline run directory recorded."""

    directory: Path
    run_id: str
    project: str
    name: str
    tags: list[str]
    start_time: float
    config: dict[str, Any]
    history: list[dict[str, Any]]  # one row per logged step, with "_step"
    summary: dict[str, Any]
    exit_code: int | None  # None when the run never finished
    record_types: list[str] = field(default_factory=list)

    def series(self, key: str) -> list[tuple[int, Any]]:
        """``(step, value)`` for every history row that has ``key`` (a "/"-free nested path
        is given as "a.b")."""
        out = []
        for row in self.history:
            value = _lookup(row, key)
            if value is not _MISSING:
                out.append((row["_step"], value))
        return out

    def table(self, value: dict[str, Any]) -> dict[str, Any]:
        """The contents (``{"columns": [...], "data": [[...], ...]}``) of a logged wandb Table,
        given the reference to it found in history or summary."""
        if value.get("_type") != "table-file":
            raise ValueError(f"not a table reference: {value!r}")
        return json.loads((self.directory / "files" / value["path"]).read_text(encoding="utf-8"))


def read_offline_runs(wandb_dir: str | Path, *, wait_s: float = 15.0) -> list[OfflineRun]:
    """Every offline run under ``wandb_dir`` (a run directory's ``wandb/``), oldest first."""
    paths = glob.glob(str(Path(wandb_dir) / "offline-run-*"))
    runs = [read_offline_run(Path(p), wait_s=wait_s) for p in paths]
    return sorted(runs, key=lambda r: (r.start_time, r.directory.name))


def read_offline_run(directory: str | Path, *, wait_s: float = 15.0) -> OfflineRun:
    """One offline run directory, polled up to ``wait_s`` for its exit record: ``run.finish()`` may return
    before wandb-core has flushed the file."""
    directory = Path(directory)
    deadline = time.monotonic() + wait_s
    while True:
        run = _read_run(directory)
        if run.exit_code is not None or time.monotonic() >= deadline:
            return run
        time.sleep(0.05)


def _read_run(directory: Path) -> OfflineRun:
    streams = list(directory.glob("run-*.wandb"))
    if len(streams) != 1:
        raise FileNotFoundError(f"expected one run-*.wandb file in {directory}, found {len(streams)}")
    run = OfflineRun(directory, "", "", "", [], 0.0, {}, [], {}, None)
    for record in iter_records(streams[0]):
        kind = record.WhichOneof("record_type")
        run.record_types.append(kind)
        if kind == "run":
            r = record.run
            run.run_id, run.project, run.name, run.tags = r.run_id, r.project, r.display_name, list(r.tags)
            run.start_time = r.start_time.seconds + r.start_time.nanos / 1e9
            _apply_updates(run.config, r.config.update, r.config.remove)
        elif kind == "config":
            _apply_updates(run.config, record.config.update, record.config.remove)
        elif kind == "history":
            row: dict[str, Any] = {}
            _apply_updates(row, record.history.item, ())
            row.setdefault("_step", record.history.step.num)
            run.history.append(row)
        elif kind == "summary":
            _apply_updates(run.summary, record.summary.update, record.summary.remove)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def iter_records(path: str | Path) -> Iterator[Any]:
    """The protobuf records of a ``run-*.wandb`` file, checking every chunk's CRC."""
    from wandb.proto import wandb_internal_pb2

    for payload in iter_payloads(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        yield record


def iter_payloads(data: bytes) -> Iterator[bytes]:
    if data[:4] != _MAGIC:
        raise ValueError(f"not a wandb record file (starts with {data[:4]!r})")
    pos, pending = _HEADER_SIZE, None
    while True:
        left_in_block = _BLOCK_SIZE - pos % _BLOCK_SIZE
        if left_in_block < _CHUNK_HEADER.size:
            pos += left_in_block
            continue
        if pos + _CHUNK_HEADER.size > len(data):
            break
        crc, length, kind = _CHUNK_HEADER.unpack_from(data, pos)
        chunk = data[pos + _CHUNK_HEADER.size : pos + _CHUNK_HEADER.size + length]
        pos += _CHUNK_HEADER.size + length
        if kind == 0 and length == 0 and crc == 0:
            continue  # zero padding
        if len(chunk) < length:
            break  # a record still being written when the file was read
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc:
            raise ValueError(f"CRC mismatch in chunk at byte {pos - length - _CHUNK_HEADER.size}")
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE and pending is not None:
            pending += chunk
        elif kind == _LAST and pending is not None:
            yield pending + chunk
            pending = None
        else:
            raise ValueError(f"unexpected chunk type {kind} at byte {pos}")


_MISSING = object()


def _apply_updates(target: dict[str, Any], updates: Any, removes: Any) -> None:
    for item in updates:
        keys = list(item.nested_key) or [item.key]
        node = target
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = json.loads(item.value_json)
    for item in removes:
        keys = list(item.nested_key) or [item.key]
        node = target
        for k in keys[:-1]:
            node = node.get(k, {})
        node.pop(keys[-1], None)


def _lookup(row: dict[str, Any], key: str) -> Any:
    if key in row:
        return row[key]
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node
