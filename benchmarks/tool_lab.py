"""The tool lab: a small chat model learns to call a calculator where a question needs arithmetic and
to answer the plays' speeches without one, by SFT and then GRPO with the calculator in the loop, on a
laptop CPU; measured as a user meets it, in a conversation.

    python -m benchmarks.tool_lab --seeds 1337 1338 1339
    python -m benchmarks.tool_lab --seeds 1337 --json          # one JSON object per seed, per line

Per seed, in ``--out``/s<seed>, four runs, each a fixed number of steps: ``base``, a short text
pretraining on the training conversations written out (it trains the tokenizer, its chat and tool
tokens reserved); ``sft_plays``, a chat fine-tune of it on the plays' exchanges alone, the comparison
for chat quality; ``sft``, the same fine-tune on the plays' exchanges mixed with calculator
conversations of every shape (``data.source: calculator``, data/sources/tool_arithmetic.py); ``grpo``,
GRPO from ``sft`` on mixed prompts with the calculator run inside each rollout, rewarded for the exact
answer and for calling exactly where a question needs it. Then, on questions and plays none trained on:

- ``pass@1_no_tools``, ``pass@1_sft``, ``pass@1_grpo``: the RL task's own evaluation, 4 samples of
  each question at temperature 1: the GRPO run without the calculator (``<|call|>`` never sampled),
  the SFT and GRPO runs with it;
- ``pass@1_by_turn``, ``pass@1_by_shape``: the GRPO run in conversations of 5 held-out questions, each
  asked after its previous answer through ``inference.chat.ChatSession`` as ``generate.py --chat
  --tools calculator --temperature 0`` asks them (the history rolled past the window as generate.py
  and serve.py roll it), passing when the final answer is the problem's; by turn position, and by
  shape group (a question counts in each of its ``shapes``);
- ``plays_calling``: the share of held-out plays prompts (a system prompt and a speech, each a chat
  of its own) whose reply calls a tool, a malformed call included;
- ``bpb_sft_plays``, ``bpb_sft``, ``bpb_grpo``: bits/byte of assistant text on every held-out plays
  exchange, ``<|end|>`` charged (``training.tasks.chat.evaluate_chat``, a chat run's validation).

``seconds`` is the seed end to end, ``<stage>_seconds`` each training run's and ``eval_seconds`` the
measurements' (null where not timed: ``labs.train_stage``). The figure is ``--out``/tool_lab.png;
``s<seed>/grpo`` is a chat run with a calculator:
``python generate.py --run runs/tool_lab/s1337/grpo --chat --tools calculator``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable

from benchmarks.labs import check_out_folder, held_out, lab_parser, run_settings, say, stage_state, train_stage
from benchmarks.shared import print_rows
from common.cli import run_stoppable
from common.config import merged as _merge

OUT = Path("runs/tool_lab")
STAGES = ("base", "sft_plays", "sft", "grpo")
WHAT = {"base": "a text pretraining on the conversations written out", "sft_plays": "SFT on the plays' exchanges "
        "alone", "sft": "SFT on the plays' exchanges and calculator conversations", "grpo": "GRPO on mixed prompts "
        "with the calculator in the loop"}
PASS_K = 4
TURNS = 5  # questions in one held-out conversation
# The model, the problems and each run's budget. The problems are enough that the mixed conversations hold
# nearly every training conversation of the plays, as the plays-only tune sees them: with half as many, the mixed
# tune saw a third of the plays' text, over and over, and its chat fell further behind. Its batch holds as many of
# the plays' replies as the plays-only tune's, beside the calculator's exchanges. GRPO is short and gentle:
# longer or at 2e-4 it lost pass@1 to the SFT run it starts from.
SIZES = {
    "lab": dict(model={"n_layer": 2, "n_head": 4, "n_kv_head": 4, "n_embd": 96, "block_size": 256, "positions": "rope"},
                problems=40000, held_out=200, conversations_asked=40, plays_prompts=50,
                base={"max_steps": 400}, sft={"max_steps": 1500}, mixed_batch=56, grpo={"max_steps": 40}),
    # A smoke test of the whole path: a few steps each, and nothing learned.
    "toy": dict(model={"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 32, "block_size": 128},
                problems=200, held_out=20, conversations_asked=1, plays_prompts=3,
                base={"max_steps": 3}, sft={"max_steps": 3}, mixed_batch=32, grpo={"max_steps": 2}),
}
PROBLEMS = {"seed": 0, "digits": 4, "operations": "+-*/", "max_terms": 4, "parentheses": True, "words": True,
            "max_exchanges": 4, "plays_share": 0.9}
VAL_FRACTION = 0.1  # the plays held out: data.val_fraction's default, as configs/tiny-chat.yaml's
# The most tokens of a measured reply: the longest call with its answer fits (a division's result is up to 17
# characters), and a plays reply's first tokens show whether it calls.
REPLY_TOKENS = 64
RESULT_FILE = "result.json"  # a finished seed's row, kept for --resume
LOG_INTERVAL = 10


def build_parser() -> argparse.ArgumentParser:
    return lab_parser("tool_lab", __doc__, OUT, SIZES)


def calculator_source(size: str) -> dict[str, Any]:
    """``data.calculator``: the SFT run's problems, ``VAL_FRACTION`` of them held out (drawn first)."""
    return {**PROBLEMS, "problems": SIZES[size]["problems"]}


def rl_section(size: str, *, tools: bool = True) -> dict[str, Any]:
    """The GRPO run's ``rl:``: the SFT run's problems, the first ``held_out`` of its held-out ones held
    out (drawn first, from the same seed and settings); ``tools`` False: the model alone."""
    s = SIZES[size]
    return {"task": "calculator", "tools": ["calculator"] if tools else [], "max_tool_calls": 2,
            "group_size": 8, "max_new_tokens": REPLY_TOKENS, "temperature": 1.0, "beta": 0.04,
            "eval_samples": PASS_K, "rewards": ["tool_answer_correct", "tool_format", "tool_when_needed"],
            "calculator": {**PROBLEMS, "val_problems": s["held_out"], "train_problems": s["problems"] - s["held_out"]}}


def write_text(folder: Path, size: str) -> Path:
    """The SFT run's training conversations as plain text, a message a line, for the base run (never
    a held-out one)."""
    from data.config import CalculatorSourceConfig, DataConfig
    from data.sources.tool_arithmetic import calculator_conversations

    conversations, _ = calculator_conversations(CalculatorSourceConfig(**calculator_source(size)), VAL_FRACTION,
                                                DataConfig().split_seed)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "conversations.txt"
    paragraphs = ("\n".join(line for m in c for line in (m.content, *(t.name + t.arguments for t in m.tool_calls))
                            if line) for c in conversations)
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return path


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
    sft = {"data": {"format": "chat", "cache_dir": cache, "val_fraction": VAL_FRACTION},
           "train": {"init_from": str(folder / "base"), "batch_size": 32, "optimizer": "muon", "muon_lr": 0.01,
                     "lr": 2e-3, "min_lr": 1e-4, "warmup_steps": 10},
           "eval": quiet_eval}
    sft_plays = _merge(run_settings(folder / "sft_plays", seed, s["sft"], overwrite, LOG_INTERVAL),
                       _merge(sft, {"data": {"source": "shakespeare"}}))
    sft = _merge(run_settings(folder / "sft", seed, s["sft"], overwrite, LOG_INTERVAL),
                 _merge(sft, {"data": {"source": "calculator", "calculator": calculator_source(size)},
                              "train": {"batch_size": s["mixed_batch"]}}))
    grpo = _merge(run_settings(folder / "grpo", seed, s["grpo"], overwrite, LOG_INTERVAL), {
        "data": {"format": "rl", "val_fraction": VAL_FRACTION},
        "train": {"init_from": str(folder / "sft"), "batch_size": 16, "lr": 1e-4, "min_lr": 1e-4,
                  "warmup_steps": 0, "weight_decay": 0.0},
        # No evaluation along the way: the lab measures the run at its end on every held-out question.
        "eval": {"interval": 0, "max_batches": 2, "sample_tokens": REPLY_TOKENS,
                 "final_max_batches": None},
        "rl": rl_section(size),
    })
    return {"base": base, "sft_plays": sft_plays, "sft": sft, "grpo": grpo}


def asked_in_conversations(new_session: Callable[[], Any], problems: list, turns: int = TURNS
                           ) -> list[tuple[int, Any, bool]]:
    """(turn, problem, passed) for each of ``problems`` asked, ``turns`` at a time in that order, as
    question 1 to ``turns`` of a conversation (a session of ``new_session``), each after the model's
    previous answer; it passes when the reply's final answer is its problem's answer."""
    asked = []
    for start in range(0, len(problems) - turns + 1, turns):
        session = new_session()
        for turn, problem in enumerate(problems[start:start + turns], 1):
            asked.append((turn, problem, session.reply(problem.question).text.strip() == problem.answer))
    return asked


def share_by(asked: Iterable[tuple[int, Any, bool]], keys: Callable[[int, Any], Iterable[Any]]) -> dict[str, float]:
    """The share passed per key; ``keys(turn, problem)`` names the groups a question counts in."""
    groups: dict[str, list[bool]] = defaultdict(list)
    for turn, problem, passed in asked:
        for key in keys(turn, problem):
            groups[str(key)].append(passed)
    return {key: round(sum(groups[key]) / len(groups[key]), 4) for key in sorted(groups)}


def calling_share(new_session: Callable[[str], Any], prompts: list[tuple[str, str]]) -> float:
    """The share of plays ``prompts`` (system prompt, speech), each a chat of its own, whose reply
    calls a tool (one that does not parse counts: the user sees it)."""
    called = [bool(reply.steps) or reply.finish_reason == "malformed call"
              for reply in (new_session(system).reply(speech) for system, speech in prompts)]
    return round(sum(called) / len(called), 4)


def plays_prompts(count: int, fits: Callable[[str, str], bool]) -> list[tuple[str, str]]:
    """(system prompt, first speech) of ``count`` held-out plays conversations spread evenly over those
    that ``fits`` (leave the window room for a reply)."""
    from data.config import DataConfig
    from data.sources.shakespeare_chat import shakespeare_chat
    from training.tasks.chat import held_out_rows

    _, val, _ = shakespeare_chat(VAL_FRACTION, DataConfig().split_seed)
    fitting = [(c[0].content, c[1].content) for c in val if fits(c[0].content, c[1].content)]
    return [fitting[i] for i in held_out_rows(fitting, count)]


def in_conversation(run_dir: Path, size: str) -> dict[str, Any]:
    """The GRPO run's pass@1 by turn position and by shape group, and its plays prompts' share of calls."""
    import torch

    from data.chat import Message, render_chat
    from data.config import CalculatorSourceConfig
    from data.sources.tool_arithmetic import tool_problems
    from inference.chat import ChatSession
    from inference.settings import GenerationSettings
    from rundir.loading import load_run
    from tools import Toolbox, load_tools

    s = SIZES[size]
    problems = tool_problems(CalculatorSourceConfig(**calculator_source(size)), s["held_out"])
    run = load_run(run_dir, torch.device("cpu"))
    settings = GenerationSettings(temperature=0.0, max_new_tokens=REPLY_TOKENS, seed=0)
    with Toolbox(load_tools(["calculator"])) as toolbox:
        def new_session(system: str | None = None) -> ChatSession:
            return ChatSession(run, settings, system_prompt=system, toolbox=toolbox)

        asked = asked_in_conversations(new_session, problems[:TURNS * s["conversations_asked"]])
        calling = calling_share(new_session, plays_prompts(s["plays_prompts"], lambda system, speech: len(
            render_chat(run.tokenizer, [Message("system", system), Message("user", speech)]).ids) <= run.block_size // 2))
    return {"pass@1_by_turn": share_by(asked, lambda turn, _: [turn]),
            "pass@1_by_shape": share_by(asked, lambda _, problem: problem.shapes), "plays_calling": calling}


def plays_bits_per_byte(folder: Path, stages: tuple[str, ...]) -> dict[str, float]:
    """Bits/byte of assistant text, ``<|end|>`` charged, of each stage's run on the held-out plays'
    exchanges (every one, in the runs' shared tokenizer and window)."""
    import torch

    from data.config import DataConfig
    from data.prepared.chat import prepare_chat_data
    from model.io import load_pretrained
    from training.distributed import DistContext
    from training.tasks.chat import evaluate_chat

    models = {stage: load_pretrained(folder / stage) for stage in stages}
    data = prepare_chat_data(DataConfig(format="chat", val_fraction=VAL_FRACTION, cache_dir=str(folder / "data_cache")),
                             folder / "base" / "tokenizer.json", models[stages[0]].config.block_size, progress=False)
    token_bytes = torch.as_tensor(data.token_bytes(), dtype=torch.long)
    return {f"bpb_{stage}": round(evaluate_chat(model, data.val, token_bytes, batch_size=32, max_batches=None,
                                                pad_id=data.eot_id, device=torch.device("cpu"), ctx=DistContext()).bpb, 4)
            for stage, model in models.items()}


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
    for name, run, tools in (("no_tools", "grpo", False), ("sft", "sft", True)):
        say(f"{label} held-out pass@1 of the {run} run {'with the calculator' if tools else 'without tools'} "
            f"({SIZES[args.size]['held_out']} problems, {PASS_K} samples each)")
        measured[name] = held_out(folder / run, {**raws["grpo"], "rl": rl_section(args.size, tools=tools)},
                                  batch_size=50)
    # The GRPO run ends on this same measure (every held-out question, eval.final_max_batches null): read it.
    from rundir.metrics import read_metrics

    final = [r for r in read_metrics(folder / "grpo" / "metrics.jsonl") if r.get("kind") == "final_eval"][-1]
    measured["grpo"] = {key.removeprefix("val_"): value for key, value in final.items() if key.startswith("val_")}
    say(f"{label} the grpo run in conversations of {TURNS} held-out questions, and on held-out plays prompts")
    talked = in_conversation(folder / "grpo", args.size)
    say(f"{label} bits/byte on the held-out plays' exchanges")
    bpb = plays_bits_per_byte(folder, ("sft_plays", "sft", "grpo"))
    row = {"seed": seed, **{f"pass@1_{name}": m["pass@1"] for name, m in measured.items()},
           **{f"pass@{PASS_K}_{name}": m[f"pass@{PASS_K}"] for name, m in measured.items()},
           **{f"calling_{name}": measured[name]["tools/calling_ratio"] for name in ("sft", "grpo")},
           **{f"parsed_{name}": measured[name]["tools/parsed_ratio"] for name in ("sft", "grpo")},
           **talked, **bpb,
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
    """Held-out pass@1 per stage and seed; the GRPO run's in conversations, by turn position and by
    shape group; each GRPO run's reward by step, and held-out pass@1 at its start and end."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rundir.metrics import read_metrics
    from training.loss_curve import write_figure

    figure = Figure(figsize=(18, 4.6), layout="constrained")
    FigureCanvasAgg(figure)
    bars, talked, curves = figure.subplots(1, 3, width_ratios=(1, 1.6, 1))
    stages = (("no_tools", "GRPO run, no tools"), ("sft", "SFT, calculator"), ("grpo", "GRPO, calculator"))
    width = 0.8 / len(stages)
    for j, (name, label) in enumerate(stages):
        drawn = bars.bar([i + (j - 1) * width for i in range(len(rows))], [row[f"pass@1_{name}"] for row in rows],
                         width, label=label)
        bars.bar_label(drawn, fmt="%.2f", fontsize="small")  # a bar of 0 is otherwise not seen at all
    bars.set_xticks(range(len(rows)), [f"seed {row['seed']}" for row in rows])
    bars.set_ylim(0, 1.25)  # room above a bar of 1 for its label and the legend
    bars.set_ylabel("held-out pass@1")
    bars.set_title("one held-out question alone")
    bars.legend(fontsize="small", loc="upper center", ncols=3)
    groups = [f"turn {t}" for t in rows[0]["pass@1_by_turn"]] + list(rows[0]["pass@1_by_shape"])
    width = 0.8 / len(rows)
    for j, row in enumerate(rows):
        shares = [*row["pass@1_by_turn"].values(), *(row["pass@1_by_shape"].get(g, 0) for g in groups[TURNS:])]
        talked.bar([i + (j - (len(rows) - 1) / 2) * width for i in range(len(groups))], shares, width,
                   label=f"seed {row['seed']}: {row['plays_calling']:.1%} of plays prompts call")
    talked.axvline(TURNS - 0.5, color="grey", linewidth=0.8)
    talked.set_xticks(range(len(groups)), groups, rotation=30, fontsize="small")
    talked.set_ylim(0, 1.25)
    talked.set_ylabel("held-out pass@1 (greedy)")
    talked.set_title(f"GRPO run, conversations of {TURNS} held-out questions: by turn, by shape")
    talked.legend(fontsize="small", loc="upper left")
    for row in rows:
        records = read_metrics(Path(row["run"]) / "metrics.jsonl")
        train = [r for r in records if r.get("kind") == "train" and "rewards/tool_answer_correct/mean" in r]
        line, = curves.plot([r["step"] for r in train], [r["rewards/tool_answer_correct/mean"] for r in train],
                            linewidth=1, alpha=0.6, label=f"seed {row['seed']}: training groups right (speeches 0)")
        curves.plot([0, train[-1]["step"] if train else 0], [row["pass@1_sft"], row["pass@1_grpo"]], "o-",
                    color=line.get_color(), markersize=4, label=f"seed {row['seed']}: held-out pass@1")
    curves.set_ylim(0, 1.05)
    curves.set_xlabel("GRPO step (held-out pass@1 on every held-out question:\nthe SFT run at 0, the GRPO run at its end)",
                      fontsize="small")
    curves.set_ylabel("share right")
    curves.set_title("GRPO with the calculator in the loop")
    curves.legend(fontsize="small", loc="lower right")
    curves.grid(alpha=0.3)
    path = out / "tool_lab.png"
    write_figure(figure, path)
    return path


COLUMNS = ("seed", "pass@1 no tools", "SFT", "GRPO", "GRPO by turn 1-5", "worst shape (GRPO)", "plays calling",
           "bits/byte plays only", "mixed SFT", "GRPO", "seed s")


def table_cells(row: dict[str, Any]) -> tuple:
    worst = min(row["pass@1_by_shape"].items(), key=lambda item: item[1], default=("-", float("nan")))
    return (row["seed"], *(f"{row[key]:.3f}" for key in ("pass@1_no_tools", "pass@1_sft", "pass@1_grpo")),
            " ".join(f"{share:.2f}" for share in row["pass@1_by_turn"].values()), f"{worst[0]} {worst[1]:.2f}",
            f"{row['plays_calling']:.1%}", *(f"{row[key]:.3f}" for key in ("bpb_sft_plays", "bpb_sft", "bpb_grpo")),
            "–" if row["seconds"] is None else f"{row['seconds']:.0f}")  # – : kept or resumed, not timed whole


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
