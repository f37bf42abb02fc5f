"""The loss curve of a run as a PNG beside its metrics: training and validation loss against the
step and against training time. People would rather look at a curve than read metrics.jsonl.

train.py draws it when a run ends; the library's ``train`` does not: importing matplotlib and drawing
take time that programs and tests calling it in a loop do not need.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from common.files import atomic_write_bytes
from rundir.files import LOSS_CURVE_FILE, METRICS_FILE
from rundir.metrics import read_metrics


def write_run_loss_curve(run_dir: Path) -> Path:
    """Draw ``run_dir``'s metrics.jsonl into its loss_curve.png; return that path."""
    out_file = run_dir / LOSS_CURVE_FILE
    write_loss_curve(run_dir / METRICS_FILE, out_file)
    return out_file


def write_loss_curve(metrics_file: Path, out_file: Path) -> None:
    """Draw the records of ``metrics_file`` into ``out_file`` (written atomically)."""
    # The object API with the Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_file)
    train = [r for r in records if r.get("kind") == "train" and "loss" in r]
    evals = [r for r in records if r.get("kind") in ("eval", "final_eval") and "val_loss" in r]
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    for axes, x, label in zip(figure.subplots(1, 2), ("step", "elapsed_s"), ("step", "training time (minutes)")):
        scale = 1 / 60 if x == "elapsed_s" else 1
        _plot(axes, train, x, "loss", scale, label="train", linewidth=1, alpha=0.8)
        _plot(axes, evals, x, "val_loss", scale, label="validation", marker="o", markersize=4)
        axes.set_xlabel(label)
        axes.set_ylabel("loss (nats/token)")
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(f"{out_file.parent.name}: loss")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(out_file, buffer.getvalue())


def _plot(axes: Any, records: list[dict[str, Any]], x: str, y: str, scale: float, **style: Any) -> None:
    points = [(r[x] * scale, r[y]) for r in records if isinstance(r.get(x), (int, float))]
    if points:
        axes.plot(*zip(*points), **style)
