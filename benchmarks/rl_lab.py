"""The RL lab: from nothing to a model that RL makes better at arithmetic, on a laptop CPU.

    python -m benchmarks.rl_lab --seeds 1337 1338 1339
    python -m benchmarks.rl_lab --seeds 1337 --json          # one JSON object per seed, per line

Per seed, in ``--out``/s<seed>, three real training runs one after the other:

1. ``base``: a text run on the training questions written out with their answers ("What is 23+58?
   81"), which trains the tokenizer (its chat tokens reserved) and the arithmetic;
2. ``chat``: a chat fine-tune of it on the same questions as conversations, so it answers after
   ``<|assistant|>`` and ends with ``<|end|>``;
3. ``rl``: GRPO from the chat run (``data.format: rl``, ``training/tasks/grpo/``) on the same questions,
   rewarded for the right answer, for a few minutes of training.

The first two stop after a fixed number of steps, chosen so that the chat run is sometimes right
on the held-out questions (what RL needs to start from), and the same on any machine.

Held-out pass@1 and pass@8 (200 questions no run trained on, 8 samples each at the RL temperature,
the RL task's own evaluation) are measured on the chat run and on the RL run; the RL run's reward,
held-out pass@1 and pass@8 and KL are drawn to ``rl/curves.png``, with the chat run's at step 0 (on
the RL run's evaluation subset, the first point of its periodic line, and on every held-out question,
beside its final point). ``rl_seconds`` is the RL run's training time."""

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.labs import check_out_folder, held_out, lab_parser, run_settings, say, train_stage
from benchmarks.shared import print_rows
from common.cli import run_stoppable
from common.config import merged as _merge
from data.sources.arithmetic import conversations, problems

OUT = Path("runs/rl_lab")
SIZES = {  # the model of the base run, and each run's budget
    "lab": dict(model={"n_layer": 2, "n_head": 4, "n_kv_head": 4, "n_embd": 96, "block_size": 32},
                base={"max_steps": 1000}, chat={"max_steps": 250}, rl={"max_minutes": 4.0}, max_operand=29),
    # A smoke test of the whole path: a few steps each, and nothing learned.
    "toy": dict(model={"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 32, "block_size": 32},
                base={"max_steps": 6}, chat={"max_steps": 3}, rl={"max_steps": 4}, max_operand=9),
}
VAL_PROBLEMS = {"lab": 200, "toy": 10}
PASS_K = 8
LOG_INTERVAL = 5


def build_parser() -> argparse.ArgumentParser:
    return lab_parser("rl_lab", __doc__, OUT, SIZES)


def rl_section(size: str) -> dict[str, Any]:
    s = SIZES[size]
    train_problems = (s["max_operand"] + 1) ** 2 - VAL_PROBLEMS[size]
    return {"group_size": 8, "max_new_tokens": 5, "temperature": 1.0, "beta": 0.04, "eval_samples": PASS_K,
            "rewards": ["correct", "closeness"],
            "arithmetic": {"seed": 0, "train_problems": train_problems, "val_problems": VAL_PROBLEMS[size],
                           "max_operand": s["max_operand"], "operations": "+"}}


def write_data(folder: Path, size: str) -> tuple[Path, Path]:
    """The training questions (the RL task's, never its held-out ones) as text and as conversations."""
    arithmetic = rl_section(size)["arithmetic"]
    items = problems(arithmetic["seed"], arithmetic["val_problems"] + arithmetic["train_problems"],
                     arithmetic["max_operand"], arithmetic["operations"])[arithmetic["val_problems"]:]
    folder.mkdir(parents=True, exist_ok=True)
    text = folder / "questions.txt"
    text.write_text("\n\n".join(f"{p.question} {p.answer}" for p in items) + "\n", encoding="utf-8")
    chats = folder / "questions.jsonl"
    chats.write_text("".join(json.dumps(row) + "\n" for row in conversations(items)), encoding="utf-8")
    return text, chats


def configs(folder: Path, seed: int, size: str, overwrite: bool) -> dict[str, dict[str, Any]]:
    s = SIZES[size]
    text, chats = write_data(folder / "data", size)
    cache = str(folder / "data_cache")
    base = _merge(run_settings(folder / "base", seed, s["base"], overwrite, LOG_INTERVAL), {
        "model": s["model"],
        # A vocabulary this small leaves the digits single tokens: sums are then learned digit by
        # digit, rather than as a table of two-digit tokens.
        "data": {"source": "files", "vocab_size": 270, "cache_dir": cache,
                 "files": {"paths": [str(text)], "txt_document": "paragraph"}},
        "train": {"batch_size": 32, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20},
        "eval": {"interval": 0, "max_batches": 4, "sample_tokens": 0, "final_max_batches": 4},
    })
    chat = _merge(run_settings(folder / "chat", seed, s["chat"], overwrite, LOG_INTERVAL), {
        "data": {"source": "files", "format": "chat", "cache_dir": cache, "files": {"paths": [str(chats)]}},
        "train": {"init_from": str(folder / "base"), "batch_size": 32, "lr": 1e-3, "min_lr": 1e-4,
                  "warmup_steps": 5},
        "eval": {"interval": 0, "max_batches": 4, "sample_tokens": 0, "final_max_batches": 4},
    })
    rl = _merge(run_settings(folder / "rl", seed, s["rl"], overwrite, LOG_INTERVAL), {
        "data": {"format": "rl"},
        "train": {"init_from": str(folder / "chat"), "batch_size": 16, "lr": 3e-4, "min_lr": 3e-4,
                  "warmup_steps": 0, "weight_decay": 0.0},
        "eval": {"interval": 25, "max_batches": 4, "sample_tokens": 8, "final_max_batches": None},
        "rl": rl_section(size),
    })
    return {"base": base, "chat": chat, "rl": rl}


def draw_curves(run_dir: Path, before_subset: dict[str, float], before: dict[str, float]) -> Path:
    """The RL run's curves (``training.loss_curve``'s, as train.py draws them) with the chat run it
    started from at step 0, on the evaluation subset and on every held-out question."""
    from rundir.metrics import read_metrics
    from training.loss_curve import draw_curves as draw_run, legend, write_figure

    figure = draw_run(read_metrics(run_dir / "metrics.jsonl"), "rl", f"{run_dir.parent.name}/{run_dir.name}")
    passes = figure.axes[1]
    for name, color in (("pass@1", "tab:blue"), (f"pass@{PASS_K}", "tab:orange")):
        # The chat run scored on the subset is the periodic line's step 0: the same questions and seeds.
        subset = f"{name} (the evaluation subset)"
        line = next((line for line in passes.get_lines() if line.get_label() == subset), None)
        if line is not None:
            line.set_data([0, *line.get_xdata()], [before_subset[name], *line.get_ydata()])
        else:  # a run too short for a periodic evaluation
            passes.plot([0], [before_subset[name]], "o-", color=color, markersize=4, label=subset)
        passes.plot([0], [before[name]], "*", color=color, markerfacecolor="none", markersize=12,
                    label=f"{name} of the chat run, all held-out questions (step 0)")
    legend(passes)
    path = run_dir / "curves.png"
    write_figure(figure, path)
    return path


STAGES = ("base", "chat", "rl")
WHAT = {"base": "a text run on the training questions with their answers",
        "chat": "a chat fine-tune on the same questions as conversations", "rl": "GRPO from the chat run"}


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from rundir.checkpoint import load_trainer_state

    folder = args.out / f"s{seed}"
    raws = configs(folder, seed, args.size, args.overwrite)
    label = f"[seed {seed}]"
    for stage in ("base", "chat"):
        train_stage(raws[stage], stage, WHAT[stage], label, args.resume)
    say(f"{label} held-out pass@1 and pass@{PASS_K} of the chat run ({VAL_PROBLEMS[args.size]} questions, "
        f"{PASS_K} samples each)")
    before = held_out(folder / "chat", raws["rl"], batch_size=32)
    before_subset = held_out(folder / "chat", raws["rl"], batch_size=32, subset=True)
    train_stage(raws["rl"], "rl", WHAT["rl"], label, args.resume)
    say(f"{label} held-out pass@1 and pass@{PASS_K} of the RL run")
    after = held_out(folder / "rl", raws["rl"], batch_size=32)
    curves = draw_curves(folder / "rl", before_subset, before)
    state = load_trainer_state(folder / "rl")  # the run's own record, also for an RL stage kept by --resume
    return {"seed": seed, "pass@1_before": before["pass@1"], "pass@1_after": after["pass@1"],
            f"pass@{PASS_K}_before": before[f"pass@{PASS_K}"], f"pass@{PASS_K}_after": after[f"pass@{PASS_K}"],
            "rl_seconds": float(state["train_seconds"]), "rl_steps": int(state["step"]), "curves": str(curves)}


def main(argv: list[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, run_lab)


def run_lab(args: argparse.Namespace) -> int:
    check_out_folder(args, STAGES)
    curves = []

    def rows():
        for seed in args.seeds:
            row = run_seed(args, seed)
            curves.append(row["curves"])
            yield row, (seed, *(f"{row[key]:.3f}" for key in ("pass@1_before", "pass@1_after", f"pass@{PASS_K}_before",
                                                                f"pass@{PASS_K}_after")),
                        f"{row['rl_seconds']:.0f}", row["rl_steps"])

    print_rows(("seed", "pass@1 before", "after", f"pass@{PASS_K} before", "after", "RL seconds", "RL steps"), rows(),
               args.json, left=0)
    if not args.json:
        print("curves: " + ", ".join(curves))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
