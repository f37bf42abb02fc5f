"""The tool lab: a small model that cannot multiply learns to call a calculator, by supervised examples
and then by reinforcement learning with the calculator in the loop, on a laptop CPU.

    python -m benchmarks.tool_lab --seeds 1337 1338 1339
    python -m benchmarks.tool_lab --seeds 1337 --json          # one JSON object per seed, per line

Per seed, in ``--out``/s<seed>, three real training runs one after the other:

1. ``base``: a short text pretraining on the training conversations written out as plain text (the
   question, the call, the result and the answer, a line each), which trains the tokenizer (its
   chat and tool tokens reserved) and little else;
2. ``sft``: a chat fine-tune on the same conversations (``data.source: calculator``): "What is
   347*812?", a call of the calculator, its result, and the result as the answer;
3. ``grpo``: GRPO from the SFT run with the calculator run inside each rollout
   (``data.format: rl``, ``rl.task: calculator``, ``rl.tools: [calculator]``), rewarded for the exact
   answer after the call and for a call that worked.

Each stops after a fixed number of steps, the same on any machine. The problems are products of
two three-digit numbers, which a model this small cannot do in its head. Held-out pass@1 is the
RL task's own evaluation: 200 problems no run trained on, 4 samples of each at temperature 1, a
sample passing when its final answer is exactly the product. It is measured three times: the GRPO
run with the calculator taken away (``<|call|>`` never sampled: the model alone, answering in its
head), the SFT run with the calculator, and the GRPO run with it. With the calculator, the lab
also counts the share of replies that call and of calls that parse. ``seconds`` is the seed end to
end, each stage's its training run's (data preparation and final evaluation included) and
``eval_seconds`` the three measurements' (null where not timed: ``labs.train_stage``). The figure is
``--out``/tool_lab.png; the last run, ``s<seed>/grpo``, is a chat run with a calculator:
``python serve.py --run runs/tool_lab/s1337/grpo``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.labs import check_out_folder, held_out, lab_parser, run_settings, say, stage_state, train_stage
from benchmarks.shared import print_rows
from common.cli import run_stoppable
from common.config import merged as _merge

OUT = Path("runs/tool_lab")
STAGES = ("base", "sft", "grpo")
WHAT = {"base": "a text pretraining on the conversations written out", "sft": "SFT on conversations that call "
        "the calculator", "grpo": "GRPO with the calculator in the loop"}
PASS_K = 4
SIZES = {  # the model, the problems and each run's budget
    "lab": dict(model={"n_layer": 2, "n_head": 4, "n_kv_head": 4, "n_embd": 96, "block_size": 64},
                problems=20000, held_out=200, base={"max_steps": 100}, sft={"max_steps": 1500},
                grpo={"max_steps": 150}, grpo_eval_interval=50),
    # A smoke test of the whole path: a few steps each, and nothing learned.
    "toy": dict(model={"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 32, "block_size": 64},
                problems=200, held_out=8, base={"max_steps": 3}, sft={"max_steps": 3}, grpo={"max_steps": 2},
                grpo_eval_interval=0),
}
PROBLEMS = {"seed": 0, "digits": 3, "operations": "*", "max_terms": 2}  # products of two three-digit numbers
RESULT_FILE = "result.json"  # a finished seed's row, kept for --resume
LOG_INTERVAL = 10


def build_parser() -> argparse.ArgumentParser:
    return lab_parser("tool_lab", __doc__, OUT, SIZES)


def calculator_problems(size: str) -> dict[str, Any]:
    """``data.calculator``: the SFT run's conversations, the first ``held_out`` of them held out."""
    return {**PROBLEMS, "problems": SIZES[size]["problems"]}


def rl_section(size: str, *, tools: bool = True) -> dict[str, Any]:
    """The GRPO run's ``rl:``: the SFT run's problems, the same ones held out (drawn first, from the
    same seed and settings); ``tools`` False: the model alone."""
    s = SIZES[size]
    return {"task": "calculator", "tools": ["calculator"] if tools else [], "max_tool_calls": 2,
            "group_size": 8, "max_new_tokens": 40, "temperature": 1.0, "beta": 0.04, "eval_samples": PASS_K,
            "rewards": ["tool_answer_correct", "tool_format"],
            "calculator": {**PROBLEMS, "val_problems": s["held_out"], "train_problems": s["problems"] - s["held_out"]}}


def write_text(folder: Path, size: str) -> Path:
    """The SFT run's training conversations as plain text, for the base run (never a held-out one)."""
    from data.config import CalculatorSourceConfig
    from data.sources.tool_arithmetic import calculator_conversations

    source = CalculatorSourceConfig(**calculator_problems(size))
    conversations, _ = calculator_conversations(source, _held_share(size), 0)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "conversations.txt"
    paragraphs = ("\n".join([m.content for m in c[:1]] + [t.name + t.arguments for t in c[1].tool_calls]
                            + [c[2].content, c[3].content]) for c in conversations)
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return path


def _held_share(size: str) -> float:
    return SIZES[size]["held_out"] / SIZES[size]["problems"]


def configs(folder: Path, seed: int, size: str, overwrite: bool) -> dict[str, dict[str, Any]]:
    s = SIZES[size]
    text = write_text(folder / "data", size)
    cache = str(folder / "data_cache")
    quiet_eval = {"interval": 0, "max_batches": 4, "sample_tokens": 0, "final_max_batches": 4}
    base = _merge(run_settings(folder / "base", seed, s["base"], overwrite, LOG_INTERVAL), {
        "model": s["model"],
        # A vocabulary this small merges the call's fixed words and leaves most digits single tokens.
        "data": {"source": "files", "vocab_size": 300, "cache_dir": cache,
                 "files": {"paths": [str(text)], "txt_document": "paragraph"}},
        "train": {"batch_size": 32, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20},
        "eval": quiet_eval,
    })
    sft = _merge(run_settings(folder / "sft", seed, s["sft"], overwrite, LOG_INTERVAL), {
        "data": {"source": "calculator", "format": "chat", "cache_dir": cache, "val_fraction": _held_share(size),
                 "calculator": calculator_problems(size)},
        "train": {"init_from": str(folder / "base"), "batch_size": 32, "optimizer": "muon", "muon_lr": 0.01,
                  "lr": 2e-3, "min_lr": 1e-4, "warmup_steps": 10},
        "eval": quiet_eval,
    })
    grpo = _merge(run_settings(folder / "grpo", seed, s["grpo"], overwrite, LOG_INTERVAL), {
        "data": {"format": "rl"},
        "train": {"init_from": str(folder / "sft"), "batch_size": 16, "lr": 2e-4, "min_lr": 2e-4,
                  "warmup_steps": 0, "weight_decay": 0.0},
        "eval": {"interval": s["grpo_eval_interval"], "max_batches": 2, "sample_tokens": 40,
                 "final_max_batches": None},
        "rl": rl_section(size),
    })
    return {"base": base, "sft": sft, "grpo": grpo}


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    folder = args.out / f"s{seed}"
    label = f"[seed {seed}]"
    kept = folder / RESULT_FILE
    if args.resume and kept.is_file() and all(stage_state(folder / s) == "finished" for s in STAGES):
        say(f"{label} finished: kept ({kept})")
        return json.loads(kept.read_text(encoding="utf-8"))
    start = time.perf_counter()
    raws = configs(folder, seed, args.size, args.overwrite)
    seconds = {stage: train_stage(raws[stage], stage, WHAT[stage], label, args.resume) for stage in STAGES}
    evals = time.perf_counter()
    measured = {}
    for name, run, tools in (("no_tools", "grpo", False), ("sft", "sft", True), ("grpo", "grpo", True)):
        say(f"{label} held-out pass@1 of the {run} run {'with the calculator' if tools else 'without tools'} "
            f"({SIZES[args.size]['held_out']} problems, {PASS_K} samples each)")
        measured[name] = held_out(folder / run, {**raws["grpo"], "rl": rl_section(args.size, tools=tools)},
                                  batch_size=50)
    row = {"seed": seed, **{f"pass@1_{name}": m["pass@1"] for name, m in measured.items()},
           **{f"pass@{PASS_K}_{name}": m[f"pass@{PASS_K}"] for name, m in measured.items()},
           **{f"calling_{name}": measured[name]["tools/calling_ratio"] for name in ("sft", "grpo")},
           **{f"parsed_{name}": measured[name]["tools/parsed_ratio"] for name in ("sft", "grpo")},
           **{f"{stage}_seconds": _rounded(seconds[stage]) for stage in STAGES},
           "eval_seconds": round(time.perf_counter() - evals, 1),
           # The seed end to end, when this command ran all of it.
           "seconds": _rounded(None if None in seconds.values() else time.perf_counter() - start),
           "run": str(folder / "grpo")}
    kept.write_text(json.dumps(row) + "\n", encoding="utf-8")
    return row


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 1)


def draw_figure(out: Path, rows: list[dict[str, Any]]) -> Path:
    """Held-out pass@1 per stage and seed, beside each GRPO run's reward and held-out pass@1 by step."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rundir.metrics import read_metrics
    from training.loss_curve import write_figure

    figure = Figure(figsize=(12, 4.4), layout="constrained")
    FigureCanvasAgg(figure)
    bars, curves = figure.subplots(1, 2)
    stages = (("no_tools", "GRPO run, no tools"), ("sft", "SFT, calculator"), ("grpo", "GRPO, calculator"))
    width = 0.8 / len(stages)
    for j, (name, label) in enumerate(stages):
        drawn = bars.bar([i + (j - 1) * width for i in range(len(rows))], [row[f"pass@1_{name}"] for row in rows],
                         width, label=label)
        bars.bar_label(drawn, fmt="%.2f", fontsize="small")  # a bar of 0 is otherwise not seen at all
    bars.set_xticks(range(len(rows)), [f"seed {row['seed']}" for row in rows])
    bars.set_ylim(0, 1.12)
    bars.set_ylabel("held-out pass@1")
    bars.set_title("held-out pass@1 (products of three-digit numbers)")
    bars.legend(fontsize="small", loc="center")
    for row in rows:
        records = read_metrics(Path(row["run"]) / "metrics.jsonl")
        train = [r for r in records if r.get("kind") == "train" and "rewards/tool_answer_correct/mean" in r]
        evals = [r for r in records if r.get("kind") == "eval" and "val_pass@1" in r]
        line, = curves.plot([r["step"] for r in train], [r["rewards/tool_answer_correct/mean"] for r in train],
                            linewidth=1, alpha=0.6, label=f"seed {row['seed']}: answers right in the training groups")
        curves.plot([0, *(r["step"] for r in evals)], [row["pass@1_sft"], *(r["val_pass@1"] for r in evals)], "o-",
                    color=line.get_color(), markersize=4, label=f"seed {row['seed']}: held-out pass@1")
    curves.set_ylim(0, 1.05)
    curves.set_xlabel("GRPO step (at 0, the SFT run on every held-out problem; then the evaluation subset)",
                      fontsize="small")
    curves.set_ylabel("share right")
    curves.set_title("GRPO with the calculator in the loop")
    curves.legend(fontsize="small", loc="lower right")
    curves.grid(alpha=0.3)
    path = out / "tool_lab.png"
    write_figure(figure, path)
    return path


COLUMNS = ("seed", "pass@1 no tools", "SFT", "GRPO", "calling (GRPO)", "calls parsed (GRPO)", "base s", "SFT s",
           "GRPO s", "eval s", "seed s")


def table_cells(row: dict[str, Any]) -> tuple:
    return (row["seed"], *(f"{row[key]:.3f}" for key in ("pass@1_no_tools", "pass@1_sft", "pass@1_grpo", "calling_grpo",
                                                          "parsed_grpo")),
            *("–" if row[key] is None else f"{row[key]:.0f}"  # – : kept or resumed, not timed whole
              for key in ("base_seconds", "sft_seconds", "grpo_seconds", "eval_seconds", "seconds")))


def main(argv: list[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, run_lab)


def run_lab(args: argparse.Namespace) -> int:
    check_out_folder(args, STAGES)
    rows, figure = [], []

    def seeds():
        for seed in args.seeds:
            rows.append(run_seed(args, seed))
            figure[:] = [draw_figure(args.out, rows)]  # after every seed: a later failure keeps it
            yield rows[-1], table_cells(rows[-1])

    print_rows(COLUMNS, seeds(), args.json, left=0)
    say(f"figure: {figure[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
