"""Where a training step's time goes: matrix products, attention, other tensor ops, and Python.

    python -m benchmarks.step_profile --config configs/tiny.yaml --steps 20

Runs ``--steps`` optimizer steps of the config's model as the trainer takes them (the next batch
from the config's own data, forward, backward, gradient clipping, the optimizer step, zeroing the
gradients; the trainer's functions, each phase under its own ``torch.profiler.record_function``
label) after ``--warmup`` untimed ones, under ``torch.profiler``, and prints two tables:

- by phase: wall milliseconds per step and share of the step, for data, forward, backward, clip
  and optimizer (Muon's Newton-Schulz matmuls are in the optimizer phase);
- by kind of work, per phase and in all: matrix products (``aten::mm``, ``addmm``, ``bmm``,
  ``baddbmm``: the kernels' own time), the attention kernels (scaled dot-product attention forward
  and backward), all other tensor operators (their own time), and the rest of the wall time, which is
  Python, autograd's bookkeeping and the dispatcher between operators.

The profiler's own overhead lands in the last column, so "Python and dispatch" is an upper bound.
The data cache must be prepared (any ``train.py`` run of the config prepares it). Timings only,
from one host under whatever load it has: quote shares, and label a loaded host so.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.shared import add_set_flag, benchmark_parser
from common.cli import positive_int, run_command
from common.threads import add_threads_argument, parse_threads, use_threads

PHASES = ("data", "forward", "backward", "clip", "optimizer")
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
KINDS = ("matmul", "attention", "other ops", "Python and dispatch")


def kind_of(op: str) -> str:
    """The kind of work a profiled operator's own time counts as."""
    if op in MATMUL_OPS:
        return "matmul"
    if "scaled_dot_product" in op:
        return "attention"
    return "other ops"


@dataclass
class Profile:
    steps: int
    wall_ms: dict[str, float]  # phase -> milliseconds over all steps
    own_ms: dict[str, dict[str, float]]  # phase -> kind -> operators' own milliseconds

    def by_kind(self, phase: str) -> dict[str, float]:
        """Milliseconds per step of each kind in ``phase``; the wall time no operator accounts for is Python."""
        own = self.own_ms[phase]
        kinds = {kind: own.get(kind, 0.0) / self.steps for kind in KINDS[:-1]}
        kinds["Python and dispatch"] = max(0.0, self.wall_ms[phase] / self.steps - sum(kinds.values()))
        return kinds


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser("step_profile", __doc__)
    p.add_argument("--config", default="configs/tiny.yaml", help="the training config profiled (default: %(default)s)")
    add_set_flag(p)
    p.add_argument("--steps", type=positive_int, default=20, help="profiled optimizer steps (default: %(default)s)")
    p.add_argument("--warmup", type=positive_int, default=3, help="untimed steps first (default: %(default)s)")
    add_threads_argument(p, why=", as train.py chooses train.threads")
    return p


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, measure)


def measure(args: argparse.Namespace) -> int:
    threads = use_threads(parse_threads(args.threads))
    profiled = profile_steps(args.config, args.set, args.steps, args.warmup)
    print(f"{args.config}: {args.steps} profiled steps, {threads.describe()}\n")
    print(tables(profiled))
    return 0


def profile_steps(config: str, overrides: list[str], steps: int, warmup: int) -> Profile:
    from model import GPT
    from training.config import load_run_config
    from training.optim import build_optimizer, plan_param_groups
    from training.rms_norm_cpu import install_cpu_backward
    from training.trainer import clip_gradients
    from training.adapters import adapters_for
    from training.tasks.prepare import prepare_task

    cfg = load_run_config(config, overrides)
    device = torch.device("cpu")
    task = prepare_task(cfg, None, progress=False, is_main=True, device=device, adapters=adapters_for(cfg.train))
    batches = task.batches(cfg.train.batch_size, seed=cfg.train.seed, rank=0, world_size=1, device=device)
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model).train()
    install_cpu_backward(model)  # as the trainer does
    optimizer = build_optimizer(plan_param_groups(model, cfg.train), cfg.train, device)

    def step() -> None:
        with record_function("data"):
            x, y = batches.next()
        with record_function("forward"):
            _, loss = model(x, y)
        with record_function("backward"):
            loss.backward()
        with record_function("clip"):
            clip_gradients(model, cfg.train.grad_clip).item()  # the trainer's one host sync per step
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return summarize(prof.events(), steps)


def summarize(events, steps: int) -> Profile:
    """Phase wall times and each phase's operators' own times by kind, from the profiler's events
    (a phase is the nearest enclosing ``record_function`` label; an operator outside any is left out)."""
    wall: dict[str, float] = defaultdict(float)
    own: dict[str, dict[str, float]] = {phase: defaultdict(float) for phase in PHASES}
    for event in events:
        if event.name in PHASES:
            wall[event.name] += event.cpu_time_total / 1e3
            continue
        phase = _phase_of(event)
        if phase is not None and event.name.startswith("aten::"):
            own[phase][kind_of(event.name)] += event.self_cpu_time_total / 1e3
    return Profile(steps, {phase: wall.get(phase, 0.0) for phase in PHASES}, own)


def _phase_of(event) -> str | None:
    parent = event.cpu_parent
    while parent is not None and parent.name not in PHASES:
        parent = parent.cpu_parent
    return None if parent is None else parent.name


def tables(p: Profile) -> str:
    total = sum(p.wall_ms.values()) / p.steps
    lines = [f"step: {total:.1f} ms (the phases' sum)\n", "| phase | ms/step | share of the step |", "|---|---:|---:|"]
    lines += [f"| {phase} | {p.wall_ms[phase] / p.steps:.1f} | {100 * p.wall_ms[phase] / p.steps / total:.1f}% |"
              for phase in PHASES]
    lines += ["", "| phase | " + " | ".join(KINDS) + " |", "|---|" + "---:|" * len(KINDS)]
    overall: dict[str, float] = defaultdict(float)
    for phase in PHASES:
        kinds = p.by_kind(phase)
        for kind, ms in kinds.items():
            overall[kind] += ms
        lines.append(f"| {phase} | " + " | ".join(f"{kinds[kind]:.1f} ms" for kind in KINDS) + " |")
    lines.append("| **all** | " + " | ".join(f"{overall[kind]:.1f} ms ({100 * overall[kind] / total:.0f}%)"
                                             for kind in KINDS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
