"""Pinpointing what is wrong with a local corpus, for one-line errors: the first malformed JSON
line (file and line number), and a dataset directory that ships a loading script."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def first_malformed_json_line(files: list[Path]) -> str | None:
    """'FILE line N: reason' for the first non-blank line that is not a JSON object, or None."""
    for path in files:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
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


def loading_script(directory: Path) -> Path | None:
    """A Python loading script at the top of a local dataset directory, if it has one."""
    scripts = sorted(directory.glob("*.py"))
    return scripts[0] if scripts else None
