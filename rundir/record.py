"""What a run records about itself beside its checkpoint: its config as written, the parent it
started from (parent.json), and ``RunRecord``, the summary of its training that the export's model
card and evaluation report."""

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from common.config import read_yaml_file
from common.errors import UserError
from common.files import atomic_write_text
from rundir.files import METRICS_FILE, PARENT_FILE, RUN_CONFIG_FILE
from rundir.metrics import read_metrics


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's config.yaml as written, sections of plain values: not rebuilt into a training
    config, since a fine-tuned run's config names a parent run that need not exist any more."""
    path = run_dir / RUN_CONFIG_FILE
    if not path.is_file():
        raise UserError(f"{run_dir} has no {RUN_CONFIG_FILE}; pass --run a run directory written by train.py")
    try:
        raw = read_yaml_file(path)
    except UserError as error:
        raise UserError(f"{path} is damaged ({error}); restore the config the run was trained with") from None
    return raw if isinstance(raw, dict) else {}


def write_parent_record(run_dir: Path, parent_dir: Path, model_config: dict[str, Any],
                        weights_sha256: str | None = None) -> None:
    """parent.json: the run a fine-tuning run started from (train.init_from), its model, and the
    SHA-256 of the weights file it started from."""
    record = {
        "init_from": str(parent_dir.resolve()),
        "model_config": model_config,
        "weights_sha256": weights_sha256,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    atomic_write_text(run_dir / PARENT_FILE, json.dumps(record, indent=2) + "\n")


def read_parent_record(run_dir: Path) -> dict[str, Any]:
    """parent.json as written; empty when the run has none or it cannot be read as a record."""
    try:
        record = json.loads((run_dir / PARENT_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


@dataclass(frozen=True)
class RunRecord:
    """What a run recorded about its training; None (or empty) where it did not record it."""

    data: dict[str, Any]  # config.yaml's data section, as written
    val_bpb: float | None
    val_scope: str | None  # "full validation set at step N" or "validation subset at step N"
    steps: int | None
    tokens_per_step: int | None

    @classmethod
    def read(cls, run_dir: Path) -> "RunRecord":
        """Never fails: a missing or damaged file leaves its part unrecorded."""
        records = read_metrics(run_dir / METRICS_FILE) if (run_dir / METRICS_FILE).is_file() else []
        train = [r for r in records if r.get("kind") == "train"]
        final = [r for r in records if r.get("kind") == "final_eval"]
        evals = [r for r in records if r.get("kind") == "eval"]
        # The saved weights are those the final validation scored; before it, those of the lowest
        # validation loss so far, the earliest of equals (training.kept_model).
        scored = [r for r in evals if isinstance(r.get("val_loss"), (int, float))]
        model_eval = final[-1] if final else min(scored, key=lambda r: r["val_loss"]) if scored else (
            evals[-1] if evals else None)
        scope = None
        if model_eval is not None:
            step = model_eval.get("weights_step", model_eval.get("step"))
            scope = f"{'full validation set' if final else 'validation subset'} at step {step}"
        return cls(
            data=_data_section(run_dir),
            val_bpb=model_eval.get("val_bpb") if model_eval else None,
            val_scope=scope,
            steps=max((r["step"] for r in records if isinstance(r.get("step"), int)), default=None),
            tokens_per_step=_tokens_per_step(train[-1]) if train else None,
        )


def _tokens_per_step(record: dict) -> int | None:
    # Every step trains on the same number of tokens; the records log the running total.
    tokens, step = record.get("tokens"), record.get("step")
    return tokens // step if isinstance(tokens, int) and isinstance(step, int) and step > 0 else None


def _data_section(run_dir: Path) -> dict[str, Any]:
    try:
        data = read_config(run_dir).get("data")
    except UserError:
        return {}
    return data if isinstance(data, dict) else {}
