"""Quality per minute: configs/tiny.yaml trained at equal wall time once per small-model
option alone (and the Muon momentum warm-up), and once with all of them together, on the same data
and seeds, back to back on one host.

    python -m benchmarks.quality_per_minute                                  # 9.2 minutes, seeds 1337 1338
    python -m benchmarks.quality_per_minute --only baseline relu-squared --minutes 0.05 --seeds 1337   # a quick check

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
import statistics
from pathlib import Path

import torch

from benchmarks.attention_variants import CONFIG, final_eval, train
from common.cli import ArgumentParser, path_arg, positive_float, run_stoppable

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


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.quality_per_minute", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=positive_float, default=9.2, help="training clock per run (train.max_minutes)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338], help="train.seed of each run of a technique")
    p.add_argument("--only", nargs="+", choices=list(TECHNIQUES), default=list(TECHNIQUES),
                   help="the techniques to run (default: all; the difference column needs baseline)")
    p.add_argument("--config", type=path_arg, default=CONFIG, help="the training config every technique starts from")
    p.add_argument("--out", type=path_arg, default=Path("runs/quality_per_minute"), help="where the runs go")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a further train.py override for every run (e.g. eval.final_max_batches=4); repeatable")
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


def train_technique(name: str, seed: int, args: argparse.Namespace) -> Path:
    """One train.py run of technique ``name`` (``attention_variants.train``, which takes the model
    overrides and names the run's folder by the name's first word and digits); other sections'
    overrides go in as further --set settings."""
    overrides = TECHNIQUES[name]
    model = {key.removeprefix("model."): value for key, value in overrides.items() if key.startswith("model.")}
    others = [f"{key}={value}" for key, value in overrides.items() if not key.startswith("model.")]
    return train(name, model, seed, argparse.Namespace(**{**vars(args), "set": args.set + others}))


def main(argv: list[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, compare)


def compare(args: argparse.Namespace) -> int:
    from training import peak_flops

    # The same measurement train.py makes for MFU on a CPU: the host's practical fp32 matmul peak.
    peak, source = peak_flops("auto", torch.device("cpu"), torch.float32)
    results = {}
    for name in args.only:
        results[name] = [final_eval(train_technique(name, seed, args)) for seed in args.seeds]
    print(f"\n{args.config.name}, {args.minutes:g} training minutes per run, seeds {args.seeds}, "
          f"host matmul peak {peak / 1e9:.1f} GFLOP/s ({source}, fp32), torch threads {torch.get_num_threads()}\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
