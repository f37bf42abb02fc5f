"""The ``evaluate.py`` command line: parse flags, evaluate the run, print lm-eval's table.

User errors and filesystem failures print one ``error: ...`` line and exit 2; Ctrl-C (130) and
SIGTERM (143) remove the temporary export first."""

import argparse
import sys
from typing import Sequence

from common.cli import ArgumentParser, path_arg, run_stoppable
from common.errors import UserError
from common.signals import held_signals
from common.threads import add_threads_argument, parse_threads, use_threads
from tracking.wandb_logger import WANDB_MODES


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="evaluate.py",
        description="Score a trained run with lm-evaluation-harness on tasks built from the plays it "
        "held out (bits per byte, next line, speaker), through its Hugging Face export, offline.",
    )
    parser.add_argument("--run", type=path_arg, metavar="DIR",
                        help="run directory written by train.py (default: the most recent run under runs/)")
    parser.add_argument("--tasks", default=None, metavar="A,B",
                        help="comma-separated tasks (default: shakespeare_bpb,shakespeare_next_line,shakespeare_speaker)")
    parser.add_argument("--items", type=int, default=500, metavar="N",
                        help="questions per multiple-choice task, drawn from the held-out plays (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="seed that draws the questions (default 0)")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="score only the first N documents of each task (lm-eval's --limit), for a quick look")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="sequences per forward pass (default 32)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps (default auto)")
    add_threads_argument(parser)
    parser.add_argument("--wandb", choices=WANDB_MODES, default=None,
                        help="log the results to wandb in this mode (default: the run's logging.wandb.mode)")
    parser.add_argument("--verbose", action="store_true",
                        help="show lm-eval's own log lines, progress bars and warnings, and its table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_stoppable(build_parser(), argv, _evaluate)


def _evaluate(args: argparse.Namespace) -> int:
    for flag, value in (("--items", args.items), ("--batch-size", args.batch_size), ("--limit", args.limit)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be a positive integer, got {value}")
    threads = parse_threads(args.threads)
    with held_signals():  # torch loads only once the flags are good, and is never half-imported
        from evaluation.runner import EvalSettings, evaluate_run
        from evaluation.tasks import TASKS, TaskSettings

    tasks = TASKS if args.tasks is None else tuple(name.strip() for name in args.tasks.split(","))
    settings = EvalSettings(
        tasks=tasks, task_settings=TaskSettings(seed=args.seed, items=args.items), batch_size=args.batch_size,
        device=args.device, limit=args.limit, wandb_mode=args.wandb, verbose=args.verbose,
    )
    from rundir.loading import find_latest_run

    use_threads(threads)
    # Progress (a line per stage, a bar while lm-eval scores) at a terminal, as git shows its own:
    # a script reading stderr gets only what went wrong.
    progress = sys.stderr if sys.stderr.isatty() else None
    report = evaluate_run(args.run or find_latest_run(), settings, progress=progress)
    print(report.table if args.verbose else report.summary)
    if report.train_bpb is not None and "shakespeare_bpb/bits_per_byte" in report.metrics:
        print(f"shakespeare_bpb: {report.metrics['shakespeare_bpb/bits_per_byte']:.4f} bits/byte with lm-eval's "
              f"rolling windows; train.py's final validation: {report.train_bpb:.4f}")
    print(f"saved to {report.results_file}")
    return 0
