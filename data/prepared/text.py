"""From a `DataConfig` to a cache entry training reads: tokenizer.json, train.bin, val.bin, meta.json.

An entry lives in `<cache_dir>/<source>-<key>/`, the key hashing everything that decides its
contents. It only ever appears by renaming a complete temporary directory built beside it, so an
entry that exists is whole: a prepare killed halfway leaves a `.tmp-*` directory, which the next
prepare removes. Entries are checked on open (sizes, token checksums and id range, tokenizer hash),
and the main process rebuilds one that fails; in a multi-process run the others wait for it.

Token files are flat uint16 arrays (uint32 when the vocabulary needs it), each document preceded by
the end-of-text token so the model learns where documents end.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from common.files import atomic_output, atomic_write_text, process_alive
from data.config import DataConfig
from data.errors import DataError
from data.sources.corpus import SourceDocuments, load_source, source_spec
from data.split import hash_split
from data.prepared.token_files import TokenDigester, check_one_window, digest_token_file
from data.tokenizer import (
    TOKENIZER_RECIPE,
    encode_documents,
    eot_id,
    load_tokenizer,
    token_byte_lengths,
    train_tokenizer,
)

# Bump when the entry layout or token file format changes: old entries then stop matching.
FORMAT_VERSION = 2  # 2: token files carry a SHA-256 and their largest id
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
_TEMP_PREFIX = ".tmp-"
POLL_S = 0.2
_REDO = "delete that cache entry and run again to prepare it afresh"


class PreparedTokenizer:
    """What a prepared entry (token files here, conversations in ``data.chat_prepare``) tells about
    its tokenizer."""

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


@dataclass
class PreparedData(PreparedTokenizer):
    """A finished cache entry. Token arrays are memory-mapped, so opening one costs nothing."""

    directory: Path
    tokenizer_path: Path
    train_path: Path
    val_path: Path
    meta: dict[str, Any]

    @classmethod
    def open(cls, directory: str | Path) -> PreparedData:
        """Open an entry, checking it is complete; raises DataError if it is not."""
        directory = Path(directory)
        meta_path = directory / META_FILE
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"prepared data in {directory} has no readable {META_FILE}; {_REDO}") from exc
        data = cls(directory, directory / TOKENIZER_FILE, directory / TRAIN_FILE, directory / VAL_FILE, meta)
        try:
            data._check_complete()
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # AttributeError: not a mapping
            raise DataError(f"prepared data in {directory} has a malformed {META_FILE}; {_REDO}") from exc
        return data

    def _check_complete(self) -> None:
        meta = self.meta
        if meta.get("format_version") != FORMAT_VERSION:
            raise DataError(f"prepared data in {self.directory} has an old format; {_REDO}")
        for split, path in (("train", self.train_path), ("val", self.val_path)):
            expected = meta["splits"][split]["tokens"] * self.dtype.itemsize
            if not path.is_file() or path.stat().st_size != expected:
                raise DataError(f"prepared data file {path} is missing or truncated; {_REDO}")
            # Same size is not same content: a file overwritten in place must not be trained on.
            found = digest_token_file(path, self.dtype)
            if found.sha256 != meta["splits"][split]["sha256"]:
                raise DataError(f"prepared data file {path} does not match its recorded checksum; {_REDO}")
            if found.max_id >= int(meta["vocab_size"]):
                raise DataError(f"prepared data file {path} holds token id {found.max_id}, beyond the "
                                f"vocabulary of {meta['vocab_size']}; {_REDO}")
        if not self.tokenizer_path.is_file() or file_sha256(self.tokenizer_path) != meta["tokenizer_sha256"]:
            raise DataError(f"prepared tokenizer {self.tokenizer_path} is missing or changed; {_REDO}")

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    def train_tokens(self) -> np.memmap:
        return np.memmap(self.train_path, dtype=self.dtype, mode="r")

    def val_tokens(self) -> np.memmap:
        return np.memmap(self.val_path, dtype=self.dtype, mode="r")

    def check_block_size(self, block_size: int) -> None:
        for split in ("train", "val"):
            check_one_window(split, self.meta["splits"][split]["tokens"], block_size)


def cache_key(cfg: DataConfig, tokenizer_file: Path | None = None) -> tuple[dict[str, Any], str]:
    """(spec, key): what decides an entry's contents, and its hash. With `tokenizer_file` (a parent
    run's, for fine-tuning) no tokenizer is trained: that file's hash replaces the recipe."""
    tokenizer = (
        {"vocab_size": cfg.vocab_size, **TOKENIZER_RECIPE}
        if tokenizer_file is None
        else {"file_sha256": file_sha256(Path(tokenizer_file))}
    )
    spec = {
        "format_version": FORMAT_VERSION,
        "source": source_spec(cfg),
        "split": {"val_fraction": cfg.val_fraction, "split_seed": cfg.split_seed},
        "tokenizer": tokenizer,
    }
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return spec, hashlib.sha256(blob).hexdigest()[:16]


def entry_dir(cfg: DataConfig) -> Path:
    """The cache directory this config's prepared data lives in."""
    return _entry(cfg, cache_key(cfg)[1])


def _entry(cfg: DataConfig, key: str) -> Path:
    return Path(cfg.cache_dir).expanduser() / f"{cfg.source}-{key}"


def prepare_data(
    cfg: DataConfig, *, progress: bool = True, is_main: bool = True, wait_timeout_s: float = 3600.0,
    tokenizer_file: Path | None = None,
) -> PreparedData:
    """The prepared data for `cfg`, built on a cache miss (main process only); with `tokenizer_file`
    tokenized by that tokenizer.json instead of a newly trained one."""
    spec, key = cache_key(cfg, tokenizer_file)
    entry = _entry(cfg, key)
    if not is_main:
        return _wait_for_entry(entry, wait_timeout_s)
    if entry.exists():
        try:
            data = PreparedData.open(entry)
        except DataError as exc:
            say(progress, f"data: rebuilding damaged cache entry ({exc})")
            _discard(entry)
        else:
            say(progress, f"data: using cached {entry} ({_totals(data.meta)})")
            return data
    return _build(cfg, spec, key, entry, progress, tokenizer_file)


def _build(
    cfg: DataConfig, spec: dict[str, Any], key: str, entry: Path, progress: bool, tokenizer_file: Path | None
) -> PreparedData:
    start = time.perf_counter()
    _remove_stale_temps(entry)
    docs = load_source(cfg, progress=progress)
    train, val, val_ids, val_from = _split(docs, cfg)
    # The owner's pid and host are in the name, so a later prepare can tell a dead one's leftovers.
    owner = f"{os.getpid()}@{socket.gethostname()}"
    temp = entry.parent / f"{_TEMP_PREFIX}{entry.name}-{secrets.token_hex(4)}-{owner}"
    try:
        temp.mkdir(parents=True)
    except OSError as exc:
        raise DataError(
            f"cannot write to data.cache_dir {entry.parent} ({exc.strerror}): choose a writable directory"
        ) from exc
    try:
        tokenizer, train_stats, val_stats = _write_tokenizer_and_tokens(temp, cfg, train, val, progress, tokenizer_file)
        _check_not_empty(train_stats, val_stats, docs.description, val_from)
        meta = {
            **spec,
            "key": key,
            "description": docs.description,
            "tokenizer_sha256": file_sha256(temp / TOKENIZER_FILE),
            "vocab_size": tokenizer.get_vocab_size(),
            "eot_id": eot_id(tokenizer),
            "dtype": token_dtype(tokenizer.get_vocab_size()).name,
            "splits": {"train": train_stats, "val": val_stats},
            "val_from": val_from,
            "val_document_ids": val_ids,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "prepare_seconds": round(time.perf_counter() - start, 3),
        }
        atomic_write_text(temp / META_FILE, json.dumps(meta, indent=1) + "\n")
        _publish(temp, entry)
    except UnicodeDecodeError as exc:
        # Arrow can hold invalid UTF-8 (e.g. from a parquet writer that did not check); it only
        # surfaces when the text is read.
        raise DataError(f"{docs.description}: text is not valid UTF-8 ({exc.reason}); fix the source") from exc
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    data = PreparedData.open(entry)
    seconds = time.perf_counter() - start
    say(progress, f"data: prepared {docs.description}: {_totals(meta)}, {seconds:.1f} s -> {entry}")
    return data


def _write_tokenizer_and_tokens(
    temp: Path, cfg: DataConfig, train: Any, val: Any, progress: bool, tokenizer_file: Path | None
) -> tuple[Tokenizer, dict[str, Any], dict[str, Any]]:
    """Train the tokenizer on `train` (or take `tokenizer_file`), save it, and write both token
    files into `temp`."""
    if tokenizer_file is not None:
        tokenizer = load_tokenizer(tokenizer_file)
    else:
        with tqdm(total=len(train), desc="training tokenizer", unit="doc", disable=not progress) as bar:
            tokenizer = train_tokenizer(_texts(train, bar), cfg.vocab_size, length=len(train))
    atomic_write_text(temp / TOKENIZER_FILE, tokenizer.to_str())
    # Corpus text that happens to spell "<|endoftext|>" stays text: only we place EOTs.
    tokenizer.encode_special_tokens = True
    write = dict(tokenizer=tokenizer, batch_size=cfg.tokenize_batch_size, progress=progress)
    train_stats = _write_tokens(train, temp / TRAIN_FILE, label="train", **write)
    val_stats = _write_tokens(val, temp / VAL_FILE, label="val", **write)
    return tokenizer, train_stats, val_stats


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (half the disk and page cache of uint32), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def _split(docs: SourceDocuments, cfg: DataConfig) -> tuple[Any, Any, list[str], str]:
    """(train, val, held-out ids, where val came from): the source's own split, or a hash split."""
    if len(docs.train) == 0:
        what = "training documents" if docs.val is not None else "documents"
        raise DataError(f"corpus is empty: {docs.description} has no {what}; check the source settings")
    if docs.val is not None:
        if len(docs.val) == 0:
            raise DataError(
                f"the validation split {docs.val_split!r} of {docs.description} is empty: set "
                "data.hub.val_split: null to hold out training documents instead"
            )
        return docs.train, docs.val, list(docs.val_ids or []), f"split {docs.val_split!r}"
    train_idx, val_idx = hash_split(docs.train_ids, cfg.val_fraction, cfg.split_seed)
    # keep_in_memory: only an index mapping is made, never an Arrow cache file on disk.
    train = docs.train.select(train_idx, keep_in_memory=True)
    val = docs.train.select(val_idx, keep_in_memory=True)
    val_from = f"hash of document ids (seed {cfg.split_seed}, fraction {cfg.val_fraction})"
    return train, val, [docs.train_ids[i] for i in val_idx], val_from


def _texts(dataset: Any, bar: tqdm, batch_size: int = 256):
    """Batches of document texts for tokenizer training, advancing `bar`."""
    for batch in dataset.iter(batch_size=batch_size):
        texts = [text or "" for text in batch["text"]]
        bar.update(len(texts))
        yield texts


def _write_tokens(
    dataset: Any, path: Path, *, label: str, tokenizer: Tokenizer, batch_size: int, progress: bool
) -> dict[str, Any]:
    """Tokenize every non-empty document of `dataset` into the flat token file `path`."""
    dtype, eot = token_dtype(tokenizer.get_vocab_size()), eot_id(tokenizer)
    documents = tokens = nbytes = 0
    digester = TokenDigester()
    bar = tqdm(total=len(dataset), desc=f"tokenizing {label}", unit="doc", disable=not progress)
    with bar, atomic_output(path) as temp, open(temp, "wb") as f:
        for batch in dataset.iter(batch_size=batch_size):
            texts = [text for text in batch["text"] if text]
            ids = np.asarray(encode_documents(tokenizer, texts, eot), dtype=dtype)
            ids.tofile(f)
            digester.update(ids)
            documents += len(texts)
            tokens += len(ids)
            nbytes += sum(len(text.encode("utf-8")) for text in texts)
            bar.update(len(batch["text"]))
    digest = digester.digest()
    return {"file": path.name, "documents": documents, "tokens": tokens, "bytes": nbytes,
            "sha256": digest.sha256, "max_id": digest.max_id}


def _check_not_empty(train: dict[str, Any], val: dict[str, Any], description: str, val_from: str) -> None:
    if train["bytes"] == 0 and val["bytes"] == 0:
        raise DataError(f"corpus is empty: {description} holds no text; check the source settings")
    if train["bytes"] == 0:
        raise DataError(
            f"the training split of {description} holds no text: use a larger corpus or a smaller "
            "data.val_fraction"
        )
    if val["bytes"] == 0:
        fix = (
            "set data.hub.val_split: null to hold out training documents instead"
            if val_from.startswith("split")
            else "use a larger corpus or a larger data.val_fraction"
        )
        raise DataError(f"the validation split ({val_from}) of {description} holds no text: {fix}")


def _publish(temp: Path, entry: Path) -> None:
    """Rename the finished temp directory into place (atomic: the entry appears whole)."""
    try:
        os.rename(temp, entry)
    except OSError:
        # Another process finished the same entry first; theirs is as good as ours.
        try:
            PreparedData.open(entry)
        except DataError:
            raise DataError(
                f"cannot create cache entry {entry}: something else is in the way; delete it and prepare again"
            ) from None


def _wait_for_entry(entry: Path, timeout_s: float) -> PreparedData:
    deadline = time.monotonic() + timeout_s
    while True:
        if (entry / META_FILE).exists():
            try:
                return PreparedData.open(entry)
            except DataError:
                pass  # damaged; the main process is replacing it
        if time.monotonic() >= deadline:
            raise DataError(
                f"waited {timeout_s:g} s for the main process to prepare {entry}: check its output "
                "for an error, or prepare the data once in a single process before launching"
            )
        time.sleep(POLL_S)


def _remove_stale_temps(entry: Path) -> None:
    """Delete temp dirs for this entry left by prepares that died. One made on another host (a cache
    on a shared filesystem) is left alone: its owner's pid means nothing here."""
    for temp in entry.parent.glob(f"{_TEMP_PREFIX}{entry.name}-*"):
        owner = temp.name[len(_TEMP_PREFIX) + len(entry.name) + 1 :].partition("-")[2]
        pid, _, host = owner.partition("@")
        if host and host != socket.gethostname():
            continue
        if not pid.isdigit() or not process_alive(int(pid)):
            shutil.rmtree(temp, ignore_errors=True)


def _discard(entry: Path) -> None:
    # Move it out of the way first, so a partly deleted entry is never seen under its real name.
    doomed = entry.parent / f"{_TEMP_PREFIX}{entry.name}-{secrets.token_hex(4)}-discarded"
    os.rename(entry, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _totals(meta: dict[str, Any]) -> str:
    splits = meta["splits"].values()
    docs = sum(s["documents"] for s in splits)
    nbytes = sum(s["bytes"] for s in splits)
    tokens = sum(s["tokens"] for s in splits)
    return (
        f"{docs:,} documents, {nbytes / 1e6:.2f} MB, {tokens:,} tokens "
        f"({nbytes / max(tokens, 1):.2f} bytes/token)"
    )


def say(progress: bool, message: str) -> None:
    """Print a data preparation message on stderr, unless progress output is off."""
    if progress:
        print(message, file=sys.stderr, flush=True)
