"""From a `DataConfig` to a cache entry training reads: tokenizer.json, train.bin, val.bin, meta.json,
as `<cache_dir>/<source>-<key>/` in the prepared-data cache (``data.prepared.cache``). Token files
are flat uint16 arrays (uint32 when the vocabulary needs it), each document preceded by the
end-of-text token so the model learns where documents end."""

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from common.errors import DataError
from common.files import atomic_output, atomic_write_text
from data.config import DataConfig
from data.prepared.cache import (
    REBUILD_ADVICE, TokenizerMixin, check_file_sha256, entry_path, file_sha256, open_checked, open_or_build,
    read_meta, spec_key,
)
from data.prepared.token_files import TokenDigester, check_one_window, digest_token_file, token_dtype
from data.sources.corpus import SourceDocuments, load_source, source_spec
from data.sources.documents import hash_split
from data.tokenizer import TOKENIZER_RECIPE, encode_documents, eot_id, load_tokenizer, train_tokenizer

# Bump when the entry layout or token file format changes: old entries then stop matching.
FORMAT_VERSION = 2  # 2: token files carry a SHA-256 and their largest id
TOKENIZER_FILE = "tokenizer.json"
TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"


@dataclass
class PreparedData(TokenizerMixin):
    """A finished cache entry. Token arrays are memory-mapped, so opening one costs nothing."""

    directory: Path
    tokenizer_path: Path
    train_path: Path
    val_path: Path
    meta: dict[str, Any]

    @classmethod
    def open(cls, directory: str | Path) -> "PreparedData":
        """Open an entry, checking it is complete; raises DataError if it is not."""
        directory = Path(directory)
        meta = read_meta(directory, FORMAT_VERSION)
        data = cls(directory, directory / TOKENIZER_FILE, directory / TRAIN_FILE, directory / VAL_FILE, meta)
        open_checked(directory, data._check_complete)
        return data

    def _check_complete(self) -> None:
        meta = self.meta
        for split, path in (("train", self.train_path), ("val", self.val_path)):
            expected = meta["splits"][split]["tokens"] * self.dtype.itemsize
            if not path.is_file() or path.stat().st_size != expected:
                raise DataError(f"prepared data file {path} is missing or truncated; {REBUILD_ADVICE}")
            # Same size is not same content: a file overwritten in place must not be trained on.
            found = digest_token_file(path, self.dtype)
            if found.sha256 != meta["splits"][split]["sha256"]:
                raise DataError(f"prepared data file {path} does not match its recorded checksum; {REBUILD_ADVICE}")
            if found.max_id >= int(meta["vocab_size"]):
                raise DataError(f"prepared data file {path} holds token id {found.max_id}, beyond the "
                                f"vocabulary of {meta['vocab_size']}; {REBUILD_ADVICE}")
        check_file_sha256(self.tokenizer_path, meta["tokenizer_sha256"], "prepared tokenizer")

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


def cache_spec(cfg: DataConfig, tokenizer_file: Path | None = None) -> dict[str, Any]:
    """What decides an entry's contents. With `tokenizer_file` (a parent run's, for fine-tuning) no
    tokenizer is trained: that file's hash replaces the recipe."""
    tokenizer = (
        {"vocab_size": cfg.vocab_size, **TOKENIZER_RECIPE}
        if tokenizer_file is None
        else {"file_sha256": file_sha256(Path(tokenizer_file))}
    )
    return {
        "format_version": FORMAT_VERSION,
        "source": source_spec(cfg),
        "split": {"val_fraction": cfg.val_fraction, "split_seed": cfg.split_seed},
        "tokenizer": tokenizer,
    }


def entry_dir(cfg: DataConfig, tokenizer_file: Path | None = None) -> Path:
    """The cache directory this config's prepared data lives in."""
    return entry_path(cfg.cache_dir, cfg.source, cache_spec(cfg, tokenizer_file))


def prepare_data(
    cfg: DataConfig, *, progress: bool = True, is_main: bool = True, wait_timeout_s: float = 3600.0,
    tokenizer_file: Path | None = None,
) -> "PreparedData":
    """The prepared data for `cfg`, built on a cache miss (main process only); with `tokenizer_file`
    tokenized by that tokenizer.json instead of a newly trained one."""
    spec = cache_spec(cfg, tokenizer_file)

    def build(temp: Path) -> dict[str, Any]:
        return _build(temp, cfg, spec, progress, tokenizer_file)

    return open_or_build(
        entry_path(cfg.cache_dir, cfg.source, spec), open_entry=PreparedData.open, build=build, totals=_totals,
        is_main=is_main, progress=progress, wait_timeout_s=wait_timeout_s,
    )


def _build(
    temp: Path, cfg: DataConfig, spec: dict[str, Any], progress: bool, tokenizer_file: Path | None
) -> dict[str, Any]:
    """Write the entry's tokenizer and token files into `temp`; return its meta."""
    docs = load_source(cfg, progress=progress)
    train, val, val_ids, val_from = _split(docs, cfg)
    try:
        tokenizer, train_stats, val_stats = _write_tokenizer_and_tokens(temp, cfg, train, val, progress, tokenizer_file)
    except UnicodeDecodeError as exc:
        # Arrow can hold invalid UTF-8 (e.g. from a parquet writer that did not check); it only
        # surfaces when the text is read.
        raise DataError(f"{docs.description}: text is not valid UTF-8 ({exc.reason}); fix the source") from exc
    _check_not_empty(train_stats, val_stats, docs.description, val_from)
    return {
        **spec,
        "key": spec_key(spec),
        "description": docs.description,
        "tokenizer_sha256": file_sha256(temp / TOKENIZER_FILE),
        "vocab_size": tokenizer.get_vocab_size(),
        "eot_id": eot_id(tokenizer),
        "dtype": token_dtype(tokenizer.get_vocab_size()).name,
        "splits": {"train": train_stats, "val": val_stats},
        "val_from": val_from,
        "val_document_ids": val_ids,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


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
            f.write(ids.data)  # not ids.tofile: a full disk then reports ENOSPC, not a bare short write
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


def _totals(meta: dict[str, Any]) -> str:
    splits = meta["splits"].values()
    docs = sum(s["documents"] for s in splits)
    nbytes = sum(s["bytes"] for s in splits)
    tokens = sum(s["tokens"] for s in splits)
    return (
        f"{docs:,} documents, {nbytes / 1e6:.2f} MB, {tokens:,} tokens "
        f"({nbytes / max(tokens, 1):.2f} bytes/token)"
    )
