"""Quality per minute, screened: candidate changes to configs/tiny.yaml trained for equal steps beside
the baseline, with a paired step cost that turns the difference into an equal-time estimate.

    python -m benchmarks.quality_per_minute --candidate rope model.positions=rope --steps 250
    python -m benchmarks.quality_per_minute --candidate rope model.positions=rope \\
        --candidate lr-down train.lr=3.2e-3 train.muon_lr=0.016 --steps 800 --seeds 1337 1338

A screen ranks candidates for the records protocol (docs/records.md), which alone decides what goes
into a config: equal wall time is fair only on a quiet host, where two runs of one config already
differ by more than most changes. Every run here takes exactly ``--steps`` optimizer steps with the
clock off, so its bits/byte does not depend on the host's speed. What a candidate costs per step is
measured apart, as a *paired* ratio: the baseline's and the candidate's training steps (the
trainer's own forward, backward, clipping and optimizer, on random tokens) take turns in this
process, so a change in load hits both sides of every pair alike; the median over pairs is the cost
ratio r (1.10: a tenth slower). In a fixed time the candidate would take about N / r steps. To turn
that into bits/byte, the baseline also trains to ``--short-steps`` M (default 0.8 N) per seed; the
slope s of its bits/byte against ln(steps) gives the equal-time estimate ``Δ_steps + s·ln(r)``, an
interpolation along the baseline's curve, not a measurement. Differences smaller than the spread
between the baseline's seeds are no effect.

Each run is a real ``train.py`` run in ``--out``/<name><steps>-s<seed>; ``--reuse`` reads runs already
finished there, to split one screen over several processes."""

import argparse
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.shared import (
    ROOT, add_set_flag, benchmark_parser, final_eval, in_turns, quartiles, run_train_py, table_head, table_row,
)
from common.cli import path_arg, positive_int, run_stoppable
from common.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser("quality_per_minute", __doc__)
    p.add_argument("--candidate", nargs="+", action="append", default=[], metavar=("NAME", "KEY=VALUE"),
                   help="a candidate: its name, then its train.py overrides; repeatable (required)")
    p.add_argument("--steps", type=positive_int, default=250,
                   help="optimizer steps of every run (default: %(default)s)")
    p.add_argument("--short-steps", type=positive_int, default=None,
                   help="the baseline's second, shorter horizon for the equal-time estimate (default 0.8 x --steps)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338],
                   help="train.seed of each run of a candidate (default: %(default)s)")
    p.add_argument("--reuse", action="store_true",
                   help="read runs already finished in --out at the same steps instead of training them again")
    p.add_argument("--pairs", type=positive_int, default=30,
                   help="timed step pairs (baseline, candidate) per candidate (default: %(default)s)")
    p.add_argument("--config", type=path_arg, default=ROOT / "configs" / "tiny.yaml",
                   help="the training config every run starts from (default: %(default)s)")
    p.add_argument("--out", type=path_arg, default=Path("runs/quality_per_minute"),
                   help="where the runs go (default: %(default)s)")
    add_set_flag(p)
    return p


def candidates(given: list[list[str]]) -> dict[str, list[str]]:
    """Each ``--candidate``'s name and overrides, the baseline (no overrides) first."""
    if not given:
        raise UserError("nothing to screen: give --candidate NAME KEY=VALUE (e.g. --candidate rope "
                        "model.positions=rope)")
    screened = {"baseline": []}
    for name, *overrides in given:
        if not re.fullmatch(r"[\w.-]+", name) or name in screened:
            raise UserError(f"--candidate {name}: a name is a new word of letters, digits, '.', '-' or '_' "
                            "(and not baseline); name each candidate once")
        if not overrides or any("=" not in setting for setting in overrides):
            raise UserError(f"--candidate {name}: give its overrides as SECTION.KEY=VALUE after its name")
        screened[name] = overrides
    return screened


def main(argv: list[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, screen)


@dataclass
class Screened:
    name: str
    finals: list[tuple[int, float]]  # (steps, val bits/byte) per seed
    cost: tuple[float, float, float] | None  # quartiles of the paired step-time ratio to the baseline


def screen(args: argparse.Namespace) -> int:
    screened = candidates(args.candidate)
    short = args.short_steps or max(1, round(0.8 * args.steps))
    if short >= args.steps:
        raise UserError(f"--short-steps ({short}) must be below --steps ({args.steps}) to give a slope")
    from common.threads import use_threads
    from training.metrics import peak_flops

    # The same measurement train.py makes for MFU on a CPU: the host's practical fp32 matmul peak.
    peak, _ = peak_flops("auto", torch.device("cpu"), torch.float32)
    # The paired steps run here, on the threads train.py's auto would take: two threads on a busy
    # pair of cores make every operator wait for the slower one, and the pairs' spread explodes.
    use_threads(None)
    rows = []
    for name, overrides in screened.items():
        finals = [screened_run(name, overrides, seed, args, args.steps) for seed in args.seeds]
        cost = None if name == "baseline" else paired_cost(args.config, args.set, overrides, args.pairs)
        rows.append(Screened(name, finals, cost))
    short_finals = [screened_run("baseline", [], seed, args, short) for seed in args.seeds]
    print(f"\n{args.config.name}, equal steps ({args.steps}; baseline also {short}), seeds {args.seeds}, "
          f"host matmul peak {peak / 1e9:.1f} GFLOP/s (fp32), torch threads {torch.get_num_threads()}\n")
    print(screening_table(rows, short_finals))
    return 0


def screened_run(name: str, overrides: list[str], seed: int, args: argparse.Namespace, steps: int) -> tuple[int, float]:
    """(steps, bits/byte) of ``name`` at ``steps``: trained now, or with ``--reuse`` read from a
    finished run of that many steps already in ``--out``."""
    run_dir = args.out / f"{name}{steps}-s{seed}"
    done = final_eval(run_dir) if args.reuse else None
    if done is not None and done[0] == steps:
        print(f"reusing {run_dir}", flush=True)
        return done
    print(f"training {name}, seed {seed}, {steps} steps -> {run_dir}", flush=True)
    run_train_py(args.config, [*args.set, f"train.seed={seed}", f"run.out_dir={run_dir}", "run.overwrite=true",
                               f"train.max_steps={steps}", "train.max_minutes=null", *overrides])
    return final_eval(run_dir)


def log_slope(long: list[tuple[int, float]], short: list[tuple[int, float]]) -> float:
    """Bits/byte gained per e-fold of steps along the baseline's curve (negative: more steps help),
    from the seeds' means at its two horizons."""
    (n, _), (m, _) = long[0], short[0]
    mean = lambda finals: statistics.fmean(bpb for _, bpb in finals)  # noqa: E731
    return (mean(long) - mean(short)) / math.log(n / m)


def equal_time_estimate(difference: float, slope: float, ratio: float) -> float:
    """The difference at equal time, from the one at equal steps (the module docstring's estimate)."""
    return difference - slope * math.log(ratio)


def screening_table(rows: list[Screened], short: list[tuple[int, float]]) -> str:
    base = next(row for row in rows if row.name == "baseline")
    base_mean = statistics.fmean(bpb for _, bpb in base.finals)
    slope = log_slope(base.finals, short)
    spread = max(b for _, b in base.finals) - min(b for _, b in base.finals)
    lines = [table_head("candidate", "steps", "val bits/byte (per seed)", "Δ at equal steps",
                        "step cost (paired, quartiles)", "Δ at equal time (estimate)")]
    for row in rows:
        mean = statistics.fmean(bpb for _, bpb in row.finals)
        bpb = " / ".join(f"{value:.4f}" for _, value in row.finals)
        if row.cost is None:
            cost, estimate = "1 (itself)", "0"
        else:
            low, mid, high = row.cost
            cost = f"{mid:.3f} ({low:.3f}-{high:.3f})"
            estimate = f"{equal_time_estimate(mean - base_mean, slope, mid):+.4f}"
        lines.append(table_row(row.name, row.finals[0][0], bpb, f"{mean - base_mean:+.4f}", cost, estimate))
    short_bpb = " / ".join(f"{value:.4f}" for _, value in short)
    lines.append(f"\nbaseline at {short[0][0]} steps: {short_bpb}; slope {slope:+.4f} bits/byte per e-fold of steps; "
                 f"spread between the baseline's seeds {spread:.4f} (a smaller difference is no effect)")
    return "\n".join(lines)


def paired_cost(config: Path, settings: list[str], overrides: list[str], pairs: int) -> tuple[float, float, float]:
    """Quartiles of the ratio candidate / baseline of training-step times, one step of each in turn."""
    runners = {"baseline": step_runner(config, settings), "candidate": step_runner(config, settings + overrides)}
    seconds = in_turns({name: runner.step for name, runner in runners.items()}, pairs, warmup=3)
    return quartiles([c / b for b, c in zip(seconds["baseline"], seconds["candidate"])])


def step_runner(config: Path, settings: list[str]):
    from benchmarks.train_throughput import TrainStepRunner
    from model.gpt import GPT
    from training.config import load_run_config
    from training.device import resolve_precision
    from training.rms_norm_cpu import install_cpu_backward

    cfg = load_run_config(config, settings)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model)
    install_cpu_backward(model)  # as the trainer does
    m = cfg.model
    return TrainStepRunner("", model, flops=model.flops_per_token(), batch_size=cfg.train.batch_size,
                           block_size=m.block_size, vocab_size=m.vocab_size, device=torch.device("cpu"),
                           amp_dtype=resolve_precision(cfg.train.precision, torch.device("cpu")),  # as it trains
                           compile_model=False, train=cfg.train)


if __name__ == "__main__":
    raise SystemExit(main())
