"""metrics.jsonl: one JSON object per logged step and per evaluation, appended by training and read
by the loss curve, the export's model card and evaluation; and ``RunRecord``, what a finished run
recorded about itself."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.errors import UserError
from common.files import atomic_write_text
from common.os_errors import with_path
from rundir.files import CONFIG_FILE, METRICS_FILE


class MetricsLog:
    """Appends records to ``metrics.jsonl``.

    Lines are appended rather than the whole file rewritten through a temporary file: rewriting
    would make an overnight run quadratic in its length. Each line goes out in one ``write`` on an
    ``O_APPEND`` descriptor, which a killed process cannot leave half-done; a line torn by a power
    cut is skipped by ``read_metrics``. The one rewrite, on resume, is atomic.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
            while written < len(data):  # only a full disk or a signal gets here
                written += os.write(fd, data[written:])
        except OSError as e:
            raise with_path(e, self.path) from None
        finally:
            os.close(fd)

    def truncate_after(self, step: int) -> None:
        """Keep only records with ``step`` <= ``step`` (the checkpoint a resumed run starts from)."""
        if not self.path.exists():
            return
        if not self.path.is_file():
            raise UserError(f"{self.path} is not a file; move it aside so the run can write its metrics there")
        kept = [r for r in read_metrics(self.path) if isinstance(r.get("step", 0), int) and r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a metrics file.

    A torn last line, bytes that are not UTF-8 or JSON, and lines that are not objects are
    skipped: a damaged line must not cost the good ones around it.
    """
    records = []
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


@dataclass(frozen=True)
class RunRecord:
    """What a run recorded about its training; None (or empty) where it did not record it."""

    data: dict[str, Any]  # config.yaml's data section, as written
    val_bpb: float | None
    val_scope: str | None  # "full validation set at step N" or "validation subset at step N"
    steps: int | None
    tokens_per_step: int | None

    @classmethod
    def read(cls, run_dir: Path) -> RunRecord:
        """Never fails: a missing or damaged file leaves its part unrecorded."""
        records = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
        train = [r for r in records if r.get("kind") == "train"]
        final = [r for r in records if r.get("kind") == "final_eval"]
        evals = final or [r for r in records if r.get("kind") == "eval"]
        last_eval = evals[-1] if evals else None
        scope = None
        if last_eval is not None:
            scope = f"{'full validation set' if final else 'validation subset'} at step {last_eval.get('step')}"
        return cls(
            data=_data_section(run_dir / CONFIG_FILE),
            val_bpb=last_eval.get("val_bpb") if last_eval else None,
            val_scope=scope,
            steps=max((r["step"] for r in records if isinstance(r.get("step"), int)), default=None),
            tokens_per_step=_tokens_per_step(train[-1]) if train else None,
        )


def _tokens_per_step(record: dict) -> int | None:
    # Every step trains on the same number of tokens; the records log the running total.
    tokens, step = record.get("tokens"), record.get("step")
    return tokens // step if isinstance(tokens, int) and isinstance(step, int) and step > 0 else None


def _data_section(config_path: Path) -> dict[str, Any]:
    if not config_path.is_file():
        return {}
    try:
        data = (yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}).get("data") or {}
    except (yaml.YAMLError, OSError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}
