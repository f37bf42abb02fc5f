"""The loss curve of a run as a PNG beside its metrics: training and validation loss against the
step and against training time. People would rather look at a curve than read metrics.jsonl.

train.py draws it when a run ends; the library's ``train`` does not: importing matplotlib and drawing
take time that programs and tests calling it in a loop do not need.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any, Callable

from common.files import atomic_write_bytes
from rundir.files import LOSS_CURVE_FILE, METRICS_FILE
from rundir.metrics import read_metrics

SUBSET_LABEL = "validation (the evaluation subset)"


def write_run_loss_curve(run_dir: Path) -> Path:
    """Draw ``run_dir``'s metrics.jsonl into its loss_curve.png; return that path."""
    out_file = run_dir / LOSS_CURVE_FILE
    write_loss_curve(run_dir / METRICS_FILE, out_file)
    return out_file


def write_loss_curve(metrics_file: Path, out_file: Path) -> None:
    """Draw the records of ``metrics_file`` into ``out_file`` (written atomically).

    The curve is in bits per byte, the number every report and table gives, with the loss in nats per
    token on the right-hand axis. Training records carry only nats per token: they are converted at
    the bytes per token of the validation split (the ratio of a validation record's two numbers);
    a run with no validation yet is drawn in nats per token alone."""
    # The object API with the Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    records = read_metrics(metrics_file)
    train = [r for r in records if r.get("kind") == "train" and _number(r.get("loss"))]
    evals = [r for r in records if r.get("kind") == "eval" and _number(r.get("val_loss"))]
    finals = [final_point(r, evals) for r in records if r.get("kind") == "final_eval" and _number(r.get("val_loss"))]
    per_nat = bits_per_byte_per_nat(evals + finals)
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    for axes, x, label in zip(figure.subplots(1, 2), ("step", "elapsed_s"), ("step", "training time (minutes)")):
        scale = 1 / 60 if x == "elapsed_s" else 1
        if per_nat is None:
            _plot(axes, train, x, lambda r: r["loss"], scale, label="train", linewidth=1, alpha=0.8)
            _plot(axes, evals, x, lambda r: r["val_loss"], scale, label=SUBSET_LABEL, marker="o", markersize=4)
            _plot_finals(axes, finals, x, lambda r: r["val_loss"], scale)
            axes.set_ylabel("loss (nats/token)")
        else:
            _plot(axes, train, x, lambda r: r["loss"] * per_nat, scale,
                  label="train (at the validation split's bytes/token)", linewidth=1, alpha=0.8)
            def bpb(record: dict[str, Any], per_nat: float = per_nat) -> float:
                return record["val_bpb"] if _number(record.get("val_bpb")) else record["val_loss"] * per_nat

            _plot(axes, evals, x, bpb, scale, label=SUBSET_LABEL, marker="o", markersize=4)
            _plot_finals(axes, finals, x, bpb, scale)
            axes.set_ylabel("bits per byte")
            nats = axes.secondary_yaxis("right", functions=(lambda b: b / per_nat, lambda n: n * per_nat))
            nats.set_ylabel("loss (nats/token)")
        axes.set_xlabel(label)
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(f"{out_file.parent.name}: loss")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(out_file, buffer.getvalue())


def final_point(final: dict[str, Any], evals: list[dict[str, Any]]) -> dict[str, Any]:
    """The final validation record placed where its weights come from: the kept weights' step
    (``weights_step``) and the training time of the evaluation that kept them."""
    step = final.get("weights_step", final.get("step"))
    kept = next((r for r in evals if r.get("step") == step), None)
    elapsed = kept.get("elapsed_s") if kept is not None else final.get("elapsed_s")
    return {**final, "step": step, "elapsed_s": elapsed}


def bits_per_byte_per_nat(evals: list[dict[str, Any]]) -> float | None:
    """Bits per byte per nat per token of the validation split, from the last evaluation that logged
    both (1 / (ln 2 x bytes per token)); None when none did."""
    for record in reversed(evals):
        bpb, loss = record.get("val_bpb"), record.get("val_loss")
        if _number(bpb) and _number(loss) and loss > 0 and bpb > 0:
            return bpb / loss
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plot(axes: Any, records: list[dict[str, Any]], x: str, y: Callable[[dict[str, Any]], float], scale: float,
          **style: Any) -> None:
    points = [(r[x] * scale, y(r)) for r in records if _number(r.get(x))]
    if points:
        axes.plot(*zip(*points), **style)


def _plot_finals(axes: Any, finals: list[dict[str, Any]], x: str, y: Callable[[dict[str, Any]], float],
                 scale: float) -> None:
    """The final full validation, a series of its own: it scores the whole split, not the subset
    the line above it scores, so joining the two would draw a jump that is no change of the model."""
    for record in finals:
        _plot(axes, [record], x, y, scale, label=f"full validation (weights of step {record['step']})",
              linestyle="none", marker="*", markersize=12, color="tab:red")
