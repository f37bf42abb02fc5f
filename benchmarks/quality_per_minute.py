"""Quality per minute: configs/tiny.yaml trained at equal wall time once per small-model
option alone (and the Muon momentum warm-up), and once with all of them together, on the same data
and seeds, back to back on one host; or, on a loaded host, screened at equal steps with a paired cost.

    python -m benchmarks.quality_per_minute                                  # 9.2 minutes, seeds 1337 1338
    python -m benchmarks.quality_per_minute --only baseline relu-squared --minutes 0.05 --seeds 1337   # a quick check
    python -m benchmarks.quality_per_minute --steps 800 --only baseline polar-express normuon   # screening

**Equal wall time** (the default) is the protocol of a record: it is what a user of tiny.yaml gets.
It is only fair on a quiet host: when other processes take the cores, each run gets whatever speed
the load leaves it at that moment, and two runs of one config differ by more than most techniques.

**Equal steps** (``--steps N``) is the screening for a loaded host. Every run takes exactly N
optimizer steps with the time budget off, so its schedule, data and arithmetic, and hence its
bits/byte, do not depend on the host's speed at all. What a technique costs per step is then
measured apart, as a *paired* ratio: the baseline's and the technique's training steps (the
trainer's own forward, backward, clipping and optimizer, on random tokens) are timed in
alternation, one step each, in this process, so a change in load hits both sides of every pair
alike; the median over pairs is the cost ratio r (1.10: a tenth slower). In a fixed time the
technique would take about N / r steps. To turn that into bits/byte, the baseline also trains to
``--short-steps`` M (default 0.8 N) per seed; the slope s of its bits/byte against ln(steps) gives
the equal-time estimate ``Δ_steps + s·ln(r)``. That estimate is an interpolation along the
baseline's curve, not a measurement: a screen's winner still needs the equal-time protocol on a
quiet host before it goes into a config. Differences smaller than the spread between seeds are no
effect.

Each run is a real ``train.py`` run (in ``--out``/<technique>-s<seed>, through
``benchmarks.attention_variants.train``) whose training clock is ``--minutes``; the final validation
pass over the whole split comes after it. The markdown table gives, per technique: steps reached,
final validation bits/byte for each seed, and the difference of the seeds' mean from the baseline's
(negative is better). The host's matmul peak is measured before the runs and printed with the
table: equal wall time only compares runs made on one host, and the peak says which host that was.
Keep a technique only if its difference is beyond the spread between seeds. Value embeddings won
that way and are now on in configs/tiny.yaml, so there their row repeats the baseline; the table in
docs/results.md was measured before, against tiny.yaml without them (and with SwiGLU's default
width, 384, where tiny.yaml now says ffn_hidden 192).
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.attention_variants import CONFIG, final_eval, train
from common.cli import ArgumentParser, path_arg, positive_float, positive_int, run_stoppable
from common.errors import UserError

# Each technique's overrides (section.key) on top of the config; "combination" is all of them.
TECHNIQUES: dict[str, dict] = {
    "baseline": {},
    "relu-squared": {"model.mlp": "relu2"},
    "qk-norm": {"model.qk_norm": True},
    "softcap": {"model.logit_softcap": 15.0},
    "residual-scalars": {"model.residual_scalars": True},
    "value-embeddings": {"model.value_embeddings": True},
    "zero-init-untied": {"model.zero_init": True, "model.tie_embeddings": False},
    "muon-momentum-warmup": {"train.muon_momentum_warmup": 300},
}
TECHNIQUES["combination"] = {key: value for overrides in TECHNIQUES.values() for key, value in overrides.items()}
# Newer candidates, screened apart from the combination above (docs/records.md says where each
# comes from and how it screened).
CANDIDATES: dict[str, dict] = {
    "polar-express": {"train.muon_iteration": "polar_express"},
    "normuon": {"train.normuon": True},
    "cautious-wd": {"train.cautious_weight_decay": True},
}
CHOICES = {**TECHNIQUES, **CANDIDATES}


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.quality_per_minute", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=positive_float, default=9.2,
                   help="training clock per run, train.max_minutes (default: %(default)s)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338],
                   help="train.seed of each run of a technique (default: %(default)s)")
    p.add_argument("--only", nargs="+", choices=list(CHOICES), default=list(TECHNIQUES),
                   help="the techniques to run (default: all but the newer candidates; the difference "
                        "column needs baseline)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="screen at equal steps instead of equal time: every run takes exactly this many "
                        "steps, and each technique's step cost is measured against the baseline's, paired "
                        "(default: equal time)")
    p.add_argument("--short-steps", type=positive_int, default=None,
                   help="with --steps: the baseline's second, shorter horizon for the equal-time estimate "
                        "(default 0.8 x --steps)")
    p.add_argument("--reuse", action="store_true",
                   help="with --steps: read runs already finished in --out at the same steps instead of "
                        "training them again (to split one screen over several processes)")
    p.add_argument("--pairs", type=positive_int, default=30,
                   help="with --steps: timed step pairs (baseline, technique) per technique (default: %(default)s)")
    p.add_argument("--config", type=path_arg, default=CONFIG,
                   help="the training config every technique starts from (default: %(default)s)")
    p.add_argument("--out", type=path_arg, default=Path("runs/quality_per_minute"),
                   help="where the runs go (default: %(default)s)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a further train.py override for every run (e.g. eval.final_max_batches=4); repeatable "
                        "(default: none)")
    return p


def table(results: dict[str, list[tuple[int, float]]]) -> str:
    """One row per technique: steps and bits/byte per seed, and the mean's difference from the baseline."""
    baseline = results.get("baseline")
    base_mean = statistics.fmean(bpb for _, bpb in baseline) if baseline else None
    lines = ["| technique | steps (per seed) | val bits/byte (per seed) | difference from baseline |",
             "|---|---:|---:|---:|"]
    for name, finals in results.items():
        mean = statistics.fmean(bpb for _, bpb in finals)
        difference = "n/a" if base_mean is None else f"{mean - base_mean:+.4f}"
        steps = " / ".join(str(step) for step, _ in finals)
        bpb = " / ".join(f"{value:.4f}" for _, value in finals)
        lines.append(f"| {name} | {steps} | {bpb} | {difference} |")
    return "\n".join(lines)


def train_technique(name: str, seed: int, args: argparse.Namespace, steps: int | None = None) -> Path:
    """One train.py run of technique ``name`` (``attention_variants.train``, which takes the model
    overrides and names the run's folder by the name's first word and digits); other sections'
    overrides go in as further --set settings. ``steps``: exactly that many, the clock off."""
    overrides = CHOICES[name]
    model = {key.removeprefix("model."): value for key, value in overrides.items() if key.startswith("model.")}
    others = [f"{key}={value}" for key, value in overrides.items() if not key.startswith("model.")]
    if steps is not None:
        others += [f"train.max_steps={steps}", "train.max_minutes=null"]
        name = f"{name} {steps}"  # the folder's name ends in the step count
    # This benchmark decides reuse itself (--reuse, in screened_run), so train.py always runs here.
    return train(name, model, seed, argparse.Namespace(**{**vars(args), "set": args.set + others, "reuse_runs": False}))


def screened_run(name: str, seed: int, args: argparse.Namespace, steps: int) -> tuple[int, float]:
    """(steps, bits/byte) of ``name`` at ``steps``: trained now, or with ``--reuse`` read from a
    finished run of that many steps already in ``--out`` (a screen split over several processes)."""
    run_dir = args.out / f"{name}{steps}-s{seed}"
    if args.reuse and (run_dir / "metrics.jsonl").is_file():
        try:
            done = final_eval(run_dir)
        except IndexError:  # begun but not finished: train it again
            done = None
        if done is not None and done[0] == steps:
            print(f"reusing {run_dir}", flush=True)
            return done
    return final_eval(train_technique(name, seed, args, steps))


def main(argv: list[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, compare)


def compare(args: argparse.Namespace) -> int:
    short = None if args.steps is None else check_screen(args)
    from training import peak_flops

    # The same measurement train.py makes for MFU on a CPU: the host's practical fp32 matmul peak.
    peak, source = peak_flops("auto", torch.device("cpu"), torch.float32)
    if short is not None:
        return screen(args, short, peak)
    results = {}
    for name in args.only:
        results[name] = [final_eval(train_technique(name, seed, args)) for seed in args.seeds]
    print(f"\n{args.config.name}, {args.minutes:g} training minutes per run, seeds {args.seeds}, "
          f"host matmul peak {peak / 1e9:.1f} GFLOP/s ({source}, fp32), torch threads {torch.get_num_threads()}\n")
    print(table(results))
    return 0


# -------------------------------------------------------------------------------------------------
# Screening at equal steps, with a paired step cost (the module doc says why).


@dataclass
class Screened:
    name: str
    finals: list[tuple[int, float]]  # (steps, val bits/byte) per seed
    cost: tuple[float, float, float] | None  # quartiles of the paired step-time ratio to the baseline


def check_screen(args: argparse.Namespace) -> int:
    """The baseline's shorter horizon, once the screen's arguments are known to make sense."""
    if "baseline" not in args.only:
        raise UserError("--steps compares every technique with the baseline at the same steps; add baseline to --only")
    short = args.short_steps or max(1, round(0.8 * args.steps))
    if short >= args.steps:
        raise UserError(f"--short-steps ({short}) must be below --steps ({args.steps}) to give a slope")
    return short


def screen(args: argparse.Namespace, short: int, peak: float) -> int:
    from common.threads import use_threads

    # The paired steps run here, on the threads train.py's auto would take: two threads on a busy
    # pair of cores make every operator wait for the slower one, and the pairs' spread explodes.
    use_threads(None)
    rows = []
    for name in args.only:
        finals = [screened_run(name, seed, args, args.steps) for seed in args.seeds]
        cost = None if name == "baseline" else paired_cost(args.config, args.set, CHOICES[name], args.pairs)
        rows.append(Screened(name, finals, cost))
    short_finals = [screened_run("baseline", seed, args, short) for seed in args.seeds]
    print(f"\n{args.config.name}, equal steps ({args.steps}; baseline also {short}), seeds {args.seeds}, "
          f"host matmul peak {peak / 1e9:.1f} GFLOP/s (fp32), torch threads {torch.get_num_threads()}\n")
    print(screening_table(rows, short_finals))
    return 0


def log_slope(long: list[tuple[int, float]], short: list[tuple[int, float]]) -> float:
    """Bits/byte gained per e-fold of steps along the baseline's curve (negative: more steps help),
    from the seeds' means at its two horizons."""
    (n, _), (m, _) = long[0], short[0]
    mean = lambda finals: statistics.fmean(bpb for _, bpb in finals)  # noqa: E731
    return (mean(long) - mean(short)) / math.log(n / m)


def equal_time_estimate(difference: float, slope: float, ratio: float) -> float:
    """The difference at equal time, from the one at equal steps: a technique ``ratio`` times as slow
    a step takes 1/ratio of the steps, which costs the baseline ``-slope·ln(ratio)`` bits/byte."""
    return difference - slope * math.log(ratio)


def screening_table(rows: list[Screened], short: list[tuple[int, float]]) -> str:
    base = next(row for row in rows if row.name == "baseline")
    base_mean = statistics.fmean(bpb for _, bpb in base.finals)
    slope = log_slope(base.finals, short)
    spread = max(b for _, b in base.finals) - min(b for _, b in base.finals)
    lines = ["| technique | steps | val bits/byte (per seed) | Δ at equal steps | step cost (paired, quartiles) "
             "| Δ at equal time (estimate) |", "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        mean = statistics.fmean(bpb for _, bpb in row.finals)
        bpb = " / ".join(f"{value:.4f}" for _, value in row.finals)
        if row.cost is None:
            cost, estimate = "1 (itself)", "0"
        else:
            low, mid, high = row.cost
            cost = f"{mid:.3f} ({low:.3f}-{high:.3f})"
            estimate = f"{equal_time_estimate(mean - base_mean, slope, mid):+.4f}"
        lines.append(f"| {row.name} | {row.finals[0][0]} | {bpb} | {mean - base_mean:+.4f} | {cost} | {estimate} |")
    short_bpb = " / ".join(f"{value:.4f}" for _, value in short)
    lines.append(f"\nbaseline at {short[0][0]} steps: {short_bpb}; slope {slope:+.4f} bits/byte per e-fold of steps; "
                 f"spread between the baseline's seeds {spread:.4f} (a smaller difference is no effect)")
    return "\n".join(lines)


def paired_cost(config: Path, settings: list[str], overrides: dict, pairs: int) -> tuple[float, float, float]:
    """Quartiles of the ratio technique / baseline of training-step times, one step of each in
    turn (``benchmarks.train_throughput.TrainStepRunner``: the trainer's own step on random tokens)."""
    runners = [step_runner(config, settings), step_runner(config, settings + [f"{k}={v}" for k, v in overrides.items()])]
    for runner in runners:  # the first steps allocate and warm caches
        for _ in range(3):
            runner.step()
    ratios = []
    for _ in range(pairs):
        base, technique = (runner.step() for runner in runners)
        ratios.append(technique / base)
    ratios.sort()
    return ratios[len(ratios) // 4], ratios[len(ratios) // 2], ratios[(3 * len(ratios)) // 4]


def step_runner(config: Path, settings: list[str]):
    from benchmarks.train_throughput import TrainStepRunner
    from model import GPT
    from training import install_cpu_backward, load_run_config, resolve_precision

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
