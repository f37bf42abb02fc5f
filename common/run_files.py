"""The names of the files in a run directory (written by training, read by generation and the
export), and how its metrics file is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.yaml"  # the resolved run configuration
TOKENIZER_FILE = "tokenizer.json"
METRICS_FILE = "metrics.jsonl"
STATE_FILE = "trainer_state.pt"  # everything --resume needs
MODEL_CONFIG_FILE = "model_config.json"  # with WEIGHTS_FILE: what save_pretrained writes
WEIGHTS_FILE = "model.safetensors"
PARENT_FILE = "parent.json"  # the run a fine-tuning run started from (train.init_from)
LOSS_CURVE_FILE = "loss_curve.png"  # drawn from METRICS_FILE at the end of training
RUN_FILES = (
    CONFIG_FILE, TOKENIZER_FILE, METRICS_FILE, STATE_FILE, MODEL_CONFIG_FILE, WEIGHTS_FILE, PARENT_FILE, LOSS_CURVE_FILE,
)
LOCK_FILE = ".run.lock"  # held by the training that writes the directory (training/run_lock.py)
LOCK_OWNER_FILE = ".run.lock.owner"  # that training's pid and host
LOCK_FILES = (LOCK_FILE, LOCK_OWNER_FILE)
EVAL_DIR = "eval"  # what evaluate.py writes: its task files (tasks/) and lm-eval's results (results.json)


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
