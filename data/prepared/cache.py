"""The one prepared-data cache: entries that appear whole, are checked on open, and are built once.

An entry is `<cache_dir>/<name>-<key>/`: a meta.json and its kind's files, the key a hash of
everything that decides the contents. An entry appears only by renaming a complete temporary
directory (a killed build's `.tmp-*` is removed by the next). Its opener checks the files against
meta.json's checksums; the main process rebuilds one that fails, and other processes wait for it."""

import hashlib
import json
import os
import secrets
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from tokenizers import Tokenizer

from common.errors import DataError, with_path
from common.files import atomic_write_text, process_alive
from data.tokenizer import load_tokenizer, token_byte_lengths

META_FILE = "meta.json"
TEMP_PREFIX = ".tmp-"
POLL_S = 0.2
REBUILD_ADVICE = "delete that cache entry and run again to prepare it afresh"



class PreparedEntry(Protocol):
    meta: dict[str, Any]


Entry = TypeVar("Entry", bound=PreparedEntry)


def spec_key(spec: dict[str, Any]) -> str:
    """A short stable hash of a JSON-able spec: the part of an entry's name that tells its contents."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


def entry_path(cache_dir: str, name: str, spec: dict[str, Any]) -> Path:
    """Where the entry for `spec` lives: `<cache_dir>/<name>-<key>`."""
    return Path(cache_dir).expanduser() / f"{name}-{spec_key(spec)}"


def open_or_build(
    entry: Path,
    *,
    open_entry: Callable[[Path], Entry],
    build: Callable[[Path], dict[str, Any]],
    totals: Callable[[dict[str, Any]], str],
    is_main: bool,
    progress: bool,
    wait_timeout_s: float,
) -> Entry:
    """The entry at `entry`, opened by `open_entry` (DataError for a damaged one). On a miss or
    damage the main process calls `build(temp)`, which fills `temp` and returns the meta, saved as
    meta.json before `temp` is renamed into place; others wait. `totals(meta)` feeds the progress."""
    if not is_main:
        return _wait_for(entry, open_entry, wait_timeout_s)
    if entry.exists():
        try:
            found = open_entry(entry)
        except DataError as exc:
            say(progress, f"data: rebuilding damaged cache entry ({exc})")
            _discard(entry)
        else:
            say(progress, f"data: using cached {entry} ({totals(found.meta)})")
            return found
    start = time.perf_counter()
    meta = _build_and_publish(entry, open_entry, build)
    seconds = time.perf_counter() - start
    built = open_entry(entry)
    say(progress, f"data: prepared {meta['description']}: {totals(meta)}, {seconds:.1f} s -> {entry}")
    return built


def _build_and_publish(
    entry: Path, open_entry: Callable[[Path], Any], build: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    _remove_stale_temps(entry)
    # The owner's pid and host are in the name, so a later build can tell a dead one's leftovers.
    owner = f"{os.getpid()}@{socket.gethostname()}"
    temp = entry.parent / f"{TEMP_PREFIX}{entry.name}-{secrets.token_hex(4)}-{owner}"
    try:
        temp.mkdir(parents=True)
    except OSError as exc:
        raise DataError(
            f"cannot write to data.cache_dir {entry.parent} ({exc.strerror}): choose a writable directory"
        ) from exc
    try:
        start = time.perf_counter()
        meta = build(temp)
        meta["prepare_seconds"] = round(time.perf_counter() - start, 3)
        atomic_write_text(temp / META_FILE, json.dumps(meta, indent=1) + "\n")
        _publish(temp, entry, open_entry)
    except OSError as exc:  # a full disk: name the entry, since its temporary folder is gone
        raise with_path(exc, entry) from None
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return meta


def read_meta(directory: Path, format_version: int | None = None) -> dict[str, Any]:
    """An entry's meta.json, refused in one line when unreadable, not a mapping, or (with
    `format_version`) of another format."""
    try:
        meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"prepared data in {directory} has no readable {META_FILE}; {REBUILD_ADVICE}") from exc
    if not isinstance(meta, dict):
        raise DataError(f"prepared data in {directory} has a malformed {META_FILE}; {REBUILD_ADVICE}")
    if format_version is not None and meta.get("format_version") != format_version:
        raise DataError(f"prepared data in {directory} has an old format; {REBUILD_ADVICE}")
    return meta


def open_checked(directory: Path, make: Callable[[], Entry]) -> Entry:
    """`make()`, with a meta.json missing a field or holding the wrong type refused in one line."""
    try:
        return make()
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise DataError(f"prepared data in {directory} has a malformed {META_FILE}; {REBUILD_ADVICE}") from exc


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_file_sha256(path: Path, expected: str, what: str) -> None:
    """Refuse a file that is missing or whose bytes no longer hash to what was recorded."""
    if not path.is_file() or file_sha256(path) != expected:
        raise DataError(f"{what} {path} is missing or changed; {REBUILD_ADVICE}")


class TokenizerMixin:
    """Mixed into a prepared entry: its tokenizer and the facts about it that meta.json records."""

    tokenizer_path: Path
    meta: dict[str, Any]

    @property
    def eot_id(self) -> int:
        return int(self.meta["eot_id"])

    @property
    def vocab_size(self) -> int:
        """The trained vocabulary's size (can be below the requested size on a small corpus)."""
        return int(self.meta["vocab_size"])

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.tokenizer_path)

    def token_bytes(self) -> np.ndarray:
        return token_byte_lengths(self.tokenizer())


def say(progress: bool, message: str) -> None:
    """Print a data preparation message on stderr, unless progress output is off."""
    if progress:
        print(message, file=sys.stderr, flush=True)


def _publish(temp: Path, entry: Path, open_entry: Callable[[Path], Any]) -> None:
    """Rename the finished temp directory into place (atomic: the entry appears whole)."""
    try:
        os.rename(temp, entry)
    except OSError:
        # Another process finished the same entry first; theirs is as good as ours.
        try:
            open_entry(entry)
        except DataError:
            raise DataError(
                f"cannot create cache entry {entry}: something else is in the way; delete it and prepare again"
            ) from None


def _wait_for(entry: Path, open_entry: Callable[[Path], Entry], timeout_s: float) -> Entry:
    deadline = time.monotonic() + timeout_s
    while True:
        if (entry / META_FILE).exists():
            try:
                return open_entry(entry)
            except DataError:
                pass  # damaged; the main process is replacing it
        if time.monotonic() >= deadline:
            raise DataError(
                f"waited {timeout_s:g} s for the main process to prepare {entry}: check its output "
                "for an error, or prepare the data once in a single process before launching"
            )
        time.sleep(POLL_S)


def _remove_stale_temps(entry: Path) -> None:
    """Delete temp dirs for this entry left by builds that died. One made on another host (a cache
    on a shared filesystem) is left alone: its owner's pid means nothing here."""
    for temp in entry.parent.glob(f"{TEMP_PREFIX}{entry.name}-*"):
        owner = temp.name[len(TEMP_PREFIX) + len(entry.name) + 1 :].partition("-")[2]
        pid, _, host = owner.partition("@")
        if host and host != socket.gethostname():
            continue
        if not pid.isdigit() or not process_alive(int(pid)):
            shutil.rmtree(temp, ignore_errors=True)


def _discard(entry: Path) -> None:
    # Move it out of the way first, so a partly deleted entry is never seen under its real name.
    doomed = entry.parent / f"{TEMP_PREFIX}{entry.name}-{secrets.token_hex(4)}-discarded"
    os.rename(entry, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
