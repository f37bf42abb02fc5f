"""The curves of a run as a PNG beside its metrics, each kind of run drawing its own numbers:

- text and chat: training and validation bits per byte, against the step and against time;
- preference (DPO): the loss, ``rewards/accuracies`` and ``rewards/margins``, training and held-out;
- rl (GRPO): the training reward, held-out pass@1 and pass@k, and the KL to the reference.

train.py draws it when a run ends; the library's ``train`` does not, sparing callers in a loop the
time matplotlib takes."""

import io
import math
from pathlib import Path
from typing import Any, Callable

from common.files import atomic_write_bytes
from rundir.files import LOSS_CURVE_FILE, METRICS_FILE
from rundir.metrics import read_metrics

SUBSET_LABEL = "validation (the evaluation subset)"
Records = list[dict[str, Any]]
# Each kind's figure, as its title names it.
WHAT = {"text": "loss", "chat": "loss on the assistant's replies", "preference": "DPO loss and rewards",
        "rl": "GRPO (reward and held-out pass@k)"}


def write_run_loss_curve(run_dir: Path, kind: str = "text") -> Path:
    """Draw ``run_dir``'s metrics.jsonl into its loss_curve.png as a ``kind`` run (its data.format);
    return that path."""
    out_file = run_dir / LOSS_CURVE_FILE
    write_loss_curve(run_dir / METRICS_FILE, out_file, kind)
    return out_file


def write_loss_curve(metrics_file: Path, out_file: Path, kind: str = "text") -> None:
    """Draw the records of ``metrics_file`` into ``out_file`` (written atomically) as a ``kind`` run."""
    figure = draw_curves(read_metrics(metrics_file), kind, out_file.parent.name)
    write_figure(figure, out_file)


def draw_curves(records: Records, kind: str, title: str) -> Any:
    """A matplotlib ``Figure`` of ``records`` as a ``kind`` run drawn; ``title`` names the run."""
    # The object API with the Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train = [r for r in records if r.get("kind") == "train" and _number(r.get("loss"))]
    evals = [r for r in records if r.get("kind") == "eval" and _number(r.get("val_loss"))]
    finals = [final_point(r, evals) for r in records if r.get("kind") == "final_eval" and _number(r.get("val_loss"))]
    panels = 3 if kind in ("preference", "rl") else 2
    # An RL figure's long legend goes under it (``legend``): room for it.
    figure = Figure(figsize=(13.2 if panels == 3 else 11, 5.6 if kind == "rl" else 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, panels)
    {"preference": _draw_preference, "rl": _draw_rl}.get(kind, _draw_loss)(axes, train, evals, finals)
    for each in axes:
        each.grid(alpha=0.3)
        if each.get_legend_handles_labels()[0]:
            legend(each)
    figure.suptitle(f"{title}: {WHAT.get(kind, 'loss')}")
    return figure


def legend(axes: Any) -> None:
    """``axes``' legend; a long one under the whole figure (a share from 0 to 1 leaves no empty corner)."""
    handles, labels = axes.get_legend_handles_labels()
    if len(handles) > 3:
        for old in list(axes.figure.legends):  # drawn again with more entries (the RL lab adds its own)
            old.remove()
        axes.figure.legend(handles, labels, fontsize="small", loc="outside lower center", ncol=2,
                           title=axes.get_title(), title_fontsize="small")
    else:
        axes.legend(fontsize="small")


def write_figure(figure: Any, out_file: Path) -> None:
    """Save ``figure`` as a PNG at ``out_file``, atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    atomic_write_bytes(out_file, buffer.getvalue())


def _draw_loss(axes: Any, train: Records, evals: Records, finals: Records) -> None:
    """Text and chat: bits per byte, with nats per token on the right-hand axis. Training records,
    in nats per token, are converted at the validation split's bytes per token; a run with no
    validation yet is drawn in nats per token alone."""
    per_nat = bits_per_byte_per_nat(evals + finals)
    for each, x, label in zip(axes, ("step", "elapsed_s"), ("step", "training time (minutes)")):
        scale = 1 / 60 if x == "elapsed_s" else 1
        if per_nat is None:
            _plot(each, train, x, lambda r: r["loss"], scale, label="train", linewidth=1, alpha=0.8)
            _plot(each, evals, x, lambda r: r["val_loss"], scale, label=SUBSET_LABEL, marker="o", markersize=4)
            _plot_finals(each, finals, x, lambda r: r["val_loss"], scale)
            each.set_ylabel("loss (nats/token)")
        else:
            _plot(each, train, x, lambda r: r["loss"] * per_nat, scale,
                  label="train (at the validation split's bytes/token)", linewidth=1, alpha=0.8)

            def bpb(record: dict[str, Any], per_nat: float = per_nat) -> float:
                return record["val_bpb"] if _number(record.get("val_bpb")) else record["val_loss"] * per_nat

            _plot(each, evals, x, bpb, scale, label=SUBSET_LABEL, marker="o", markersize=4)
            _plot_finals(each, finals, x, bpb, scale)
            each.set_ylabel("bits per byte")
            nats = each.secondary_yaxis("right", functions=(lambda b: b / per_nat, lambda n: n * per_nat))
            nats.set_ylabel("loss (nats/token)")
        each.set_xlabel(label)


def _draw_preference(axes: Any, train: Records, evals: Records, finals: Records) -> None:
    """DPO: its loss, the share of pairs whose chosen reply out-rewards the rejected one, and the mean
    reward margin; training steps as lines, held-out pairs as points."""
    panels = (("loss", "val_loss", "DPO loss"), ("rewards/accuracies", "val_rewards/accuracies", "rewards/accuracies"),
              ("rewards/margins", "val_rewards/margins", "rewards/margins"))
    for each, (train_key, val_key, name) in zip(axes, panels):
        _plot(each, [r for r in train if _number(r.get(train_key))], "step", lambda r, k=train_key: r[k], 1,
              label="training pairs", linewidth=1, alpha=0.8)
        held = [r for r in evals if _number(r.get(val_key))]
        _plot(each, held, "step", lambda r, k=val_key: r[k], 1, label="held-out pairs (the evaluation subset)",
              marker="o", markersize=4)
        _plot_finals(each, [r for r in finals if _number(r.get(val_key))], "step", lambda r, k=val_key: r[k], 1,
                     what="held-out pairs, all")
        each.set_title(name)
        each.set_ylabel(name)
        each.set_xlabel("step")
    axes[1].set_ylim(-0.05, 1.05)


def _draw_rl(axes: Any, train: Records, evals: Records, finals: Records) -> None:
    """GRPO: the mean reward of the training groups (the sum of the reward functions, on its own axis),
    held-out pass@1 and pass@k (shares, 0 to 1) and the KL to the reference."""
    reward, passes, kl = axes
    _plot(reward, [r for r in train if _number(r.get("reward"))], "step", lambda r: r["reward"], 1,
          label="training groups", linewidth=1)
    reward.set_title("reward (the sum of the reward functions)")
    reward.set_ylabel("mean reward of the training groups")
    names = sorted({k.removeprefix("val_") for r in evals + finals for k in r
                    if k.startswith("val_pass@")}, key=lambda n: int(n.removeprefix("pass@")))
    for name, color in zip(names, ("tab:blue", "tab:orange")):
        key = f"val_{name}"
        _plot(passes, [r for r in evals if _number(r.get(key))], "step", lambda r, k=key: r[k], 1,
              label=f"{name} (the evaluation subset)", marker="o", markersize=4, color=color)
        _plot_finals(passes, [r for r in finals if _number(r.get(key))], "step", lambda r, k=key: r[k], 1,
                     what=f"{name}, all held-out questions", color=color)
    passes.set_title("held-out pass@1 and pass@k")
    passes.set_ylabel("share of held-out questions")
    passes.set_ylim(-0.05, 1.05)
    _plot(kl, [r for r in train if _number(r.get("kl"))], "step", lambda r: r["kl"], 1, color="tab:red")
    kl.set_title("KL to the reference")
    kl.set_ylabel("KL (nats/token)")
    for each in axes:
        each.set_xlabel("step")


def final_point(final: dict[str, Any], evals: Records) -> dict[str, Any]:
    """The final validation record placed where its weights come from: the kept weights' step
    (``weights_step``) and the training time of the evaluation that kept them."""
    step = final.get("weights_step", final.get("step"))
    kept = next((r for r in evals if r.get("step") == step), None)
    elapsed = kept.get("elapsed_s") if kept is not None else final.get("elapsed_s")
    return {**final, "step": step, "elapsed_s": elapsed}


def bits_per_byte_per_nat(evals: Records) -> float | None:
    """Bits per byte per nat per token of the validation split, from the last evaluation that logged
    both (1 / (ln 2 x bytes per token)); None when none did."""
    for record in reversed(evals):
        bpb, loss = record.get("val_bpb"), record.get("val_loss")
        if _number(bpb) and _number(loss) and loss > 0 and bpb > 0:
            return bpb / loss
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _plot(axes: Any, records: Records, x: str, y: Callable[[dict[str, Any]], float], scale: float,
          **style: Any) -> None:
    points = [(r[x] * scale, y(r)) for r in records if _number(r.get(x))]
    if points:
        axes.plot(*zip(*points), **style)


def _plot_finals(axes: Any, finals: Records, x: str, y: Callable[[dict[str, Any]], float], scale: float,
                 what: str = "full validation", color: str = "tab:red") -> None:
    """The final full validation, a series of its own: it scores the whole split, not the subset
    the line above it scores, so joining the two would draw a jump that is no change of the model."""
    for record in finals:
        _plot(axes, [record], x, y, scale, label=f"{what} (weights of step {record['step']})",
              linestyle="none", marker="*", markersize=12, color=color)
