"""Corpus sources: the embedded plays, a hub dataset, local files, the induction lab's synthetic
repeats, or the plays' passages written twice (quotes). Each ends as `SourceDocuments` with a stable
id per document for the split to hash. `source_spec` describes a source for the cache key without
reading it or importing `datasets`, so a cache hit costs milliseconds."""

import contextlib
import importlib
from types import ModuleType
from typing import Any, Iterator

from common.errors import DataError
from data.config import DataConfig
from data.sources.documents import SourceDocuments

# Each source's module, imported only when a config names it. Each has ``spec(cfg)`` and
# ``load(cfg, progress)``.
SOURCES = {"shakespeare": "data.sources.shakespeare", "hub": "data.sources.hub", "files": "data.sources.local_files",
           "synthetic": "data.sources.synthetic", "quotes": "data.sources.quotes"}


def source_spec(cfg: DataConfig) -> dict[str, Any]:
    """Everything about the source that decides its documents, as plain JSON-able values."""
    return _source(cfg).spec(cfg)


def load_source(cfg: DataConfig, *, progress: bool) -> SourceDocuments:
    """Read the configured corpus."""
    source = _source(cfg)
    with datasets_progress(progress):
        return source.load(cfg, progress)


def _source(cfg: DataConfig) -> ModuleType:
    if cfg.source not in SOURCES:
        raise DataError(f"unknown data.source {cfg.source!r}: use shakespeare, hub, files, synthetic or quotes")
    return importlib.import_module(SOURCES[cfg.source])


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
