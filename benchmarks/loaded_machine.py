"""The main commands beside other work: each one's time with two busy neighbours against its time alone.

    python -m benchmarks.loaded_machine                        # train.py 40 steps, generate.py 200 tokens
    python -m benchmarks.loaded_machine --steps 10 --new-tokens 50 --repeats 1 --only generate.py

Users run these commands next to a browser, an IDE or a second training run. The neighbours here
are two other PyTorch processes multiplying matrices at torch's default threads (spinning OpenMP
workers included), started before the command and stopped after it. Each command is timed as a
whole process (its start-up and the model's loading included), alone and beside the neighbours,
under two thread policies:

- old: what the commands did before they had a policy: one thread per CPU and GNU OpenMP's default
  of spinning idle workers (``GOMP_SPINCOUNT=300000``, which overrides the commands' own setting);
- new: the commands' defaults today (``--threads auto``, workers that sleep; see common/threads.py).

Reported: the median wall time of each, and loaded ÷ quiet. Two cores shared by three busy
processes give each a third, so a fair slowdown is about 3x; the goal is at most 4x. Run it on an
otherwise quiet machine: the "quiet" rows are only as quiet as the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.shared import benchmark_parser
from common.cli import positive_int, run_command, whole_number

ROOT = Path(__file__).resolve().parents[1]
NEIGHBOUR = (
    "import time, torch\n"
    "a = torch.randn(384, 384)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)
OLD_POLICY = {"GOMP_SPINCOUNT": "300000"}
MAX_NEIGHBOURS = 64  # each one a busy process: a machine many times over-subscribed already shows the effect


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser("loaded_machine", __doc__)
    p.add_argument("--config", default="configs/tiny.yaml", help="the model and data (default: %(default)s)")
    p.add_argument("--only", nargs="+", choices=("train.py", "generate.py"), default=None,
                   help="time only these commands; the run to generate from is trained either way (default: both)")
    p.add_argument("--steps", type=positive_int, default=40, help="train.py steps (default: %(default)s)")
    p.add_argument("--new-tokens", type=positive_int, default=200, help="generate.py tokens (default: %(default)s)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed runs of each case; the median is reported (default: %(default)s)")
    p.add_argument("--neighbours", type=neighbour_count, default=2,
                   help=f"busy PyTorch processes beside the command, 0 to {MAX_NEIGHBOURS} (default: %(default)s)")
    return p


def commands(workdir: Path, config: str, steps: int, new_tokens: int) -> dict[str, list[str]]:
    run = workdir / "run"
    train = [sys.executable, "train.py", "--config", config, "--no-progress", "--overwrite",
             "--set", f"train.max_steps={steps}", "--set", "train.max_minutes=null", "--set", "eval.interval=0",
             "--set", "eval.final_max_batches=2", "--set", "eval.sample_tokens=0",
             "--set", "logging.wandb.mode=disabled", "--set", f"run.out_dir={run}"]
    generate = [sys.executable, "generate.py", "--run", str(run), "--prompt", "ROMEO:", "--temperature", "0",
                "--max-new-tokens", str(new_tokens), "--quiet"]
    return {"train.py": train, "generate.py": generate}


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


@contextlib.contextmanager
def neighbours(count: int):
    """``count`` busy PyTorch processes at their default settings, stopped on the way out."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    procs = [subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=env) for _ in range(count)]
    try:
        time.sleep(2.0)  # past their torch import: busy when the command starts
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def policy_env(policy: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(WANDB_MODE="disabled")
    return {**env, **OLD_POLICY} if policy == "old" else env


def policy_command(command: list[str], policy: str) -> list[str]:
    # Before the policy, torch took one thread per CPU.
    return [*command, "--threads", str(os.cpu_count() or 1)] if policy == "old" else command


def neighbour_count(text: str) -> int:
    """--neighbours: each one is a process, so a count is bounded before any is started."""
    value = whole_number(text)
    if value is None or value > MAX_NEIGHBOURS:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to {MAX_NEIGHBOURS}, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, measure)


def measure(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="loaded-machine-") as folder:
        cases = commands(Path(folder), str(Path(args.config).resolve()), args.steps, args.new_tokens)
        timed(cases["train.py"], policy_env("new"))  # prepares the data and leaves a run to generate from
        cases = {name: command for name, command in cases.items() if args.only is None or name in args.only}
        print(f"{os.cpu_count()} CPUs; {args.neighbours} neighbours; median of {args.repeats}; "
              f"train.py {args.steps} steps, generate.py {args.new_tokens} tokens")
        print(f"{'command':<12} {'policy':<6} {'quiet s':>8} {'loaded s':>9} {'loaded/quiet':>13}")
        for name, command in cases.items():
            for policy in ("old", "new"):
                env, cmd = policy_env(policy), policy_command(command, policy)
                quiet = statistics.median(timed(cmd, env) for _ in range(args.repeats))
                with neighbours(args.neighbours):
                    loaded = statistics.median(timed(cmd, env) for _ in range(args.repeats))
                print(f"{name:<12} {policy:<6} {quiet:>8.2f} {loaded:>9.2f} {loaded / quiet:>12.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
