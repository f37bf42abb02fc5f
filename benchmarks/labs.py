"""What the two post-training labs (``rl_lab`` and ``tool_lab``) share: their command line, the
settings every run of theirs takes, the check of the lab folder, and training one stage.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.shared import benchmark_parser
from common.cli import Terminated, non_negative_int, path_arg
from common.errors import UserError


def lab_parser(module: str, doc: str, out: Path, sizes: dict[str, Any]) -> argparse.ArgumentParser:
    p = benchmark_parser(module, doc)
    p.add_argument("--seeds", type=non_negative_int, nargs="+", required=True,
                   help="train.seed of each seed's runs (required)")
    p.add_argument("--out", type=path_arg, default=out,
                   help="where the runs go, a folder per seed (default: %(default)s)")
    p.add_argument("--size", choices=sorted(sizes), default="lab",
                   help="lab, or toy for a smoke test (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object per seed instead of a table")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the lab in --out: finished runs are kept, an interrupted one resumes")
    again.add_argument("--overwrite", action="store_true", help="replace runs already in --out")
    return p


def run_settings(out_dir: Path, seed: int, budget: dict[str, Any], overwrite: bool,
                 log_interval: int) -> dict[str, Any]:
    """The raw config sections every lab run shares: the CPU in fp32 (bf16 is no faster at these sizes,
    docs/training.md#precision), no compile, no wandb, no checkpoints but the last, and a fixed MFU
    peak (a lab's runs are read for what they learn, not their speed)."""
    return {
        "train": {**budget, "seed": seed, "device": "cpu", "precision": "fp32", "compile": False,
                  "peak_flops": 1e11},
        "logging": {"interval": log_interval, "wandb": {"mode": "disabled"}},
        "run": {"out_dir": str(out_dir), "overwrite": overwrite, "checkpoint_interval": 0},
    }


def stage_state(run_dir: Path) -> str:
    """``new``, ``finished`` or ``stopped`` (``rundir.checkpoint.run_progress``)."""
    from rundir.checkpoint import run_progress

    return run_progress(run_dir)


def check_out_folder(args: argparse.Namespace, stages: tuple[str, ...]) -> None:
    """Refuse, before anything trains, a lab folder that holds runs the command was not told what to do with."""
    if args.resume or args.overwrite:
        return
    for seed in args.seeds:
        for stage in stages:
            run_dir = args.out / f"s{seed}" / stage
            if stage_state(run_dir) != "new":
                raise UserError(f"{run_dir} already holds a run of the lab; pass --resume to continue the lab "
                                f"(finished runs are kept), --overwrite to run it again, or --out for another folder")


def say(line: str) -> None:
    """A progress line: stderr, so that stdout stays the table or the JSON lines."""
    print(line, file=sys.stderr, flush=True)


def train_stage(raw: dict[str, Any], stage: str, what: str, label: str, resume: bool) -> float | None:
    """Train one stage from its raw config (or continue it); its wall-clock seconds, or None for a
    finished stage kept under --resume, or a resumed one, whose time this command did not see whole.
    A stage stopped by Ctrl-C or SIGTERM stops the lab, raising the signal's exception."""
    from training.config import config_from_dict
    from training.trainer import train

    config = config_from_dict(copy.deepcopy(raw))
    state = stage_state(config.out_dir) if resume else "new"
    say(f"{label} {stage}: {what}, in {config.out_dir}"
        + {"new": "", "finished": " (finished: kept)", "stopped": " (resuming)"}[state])
    if state == "finished":
        return None
    start = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):
        result = train(config, resume=state == "stopped", progress=True)
    if result.interrupted:  # the stage saved a checkpoint and stopped: so does the lab (exit 130 or 143)
        say(f"{label} {stage}: stopped at step {result.step}; continue the lab with --resume")
        raise KeyboardInterrupt if result.signal == signal.SIGINT else Terminated(result.signal or signal.SIGTERM)
    return None if state == "stopped" else time.perf_counter() - start


def held_out(run_dir: Path, rl_raw: dict[str, Any], *, batch_size: int, subset: bool = False) -> dict[str, float]:
    """The RL task's own evaluation of ``run_dir`` (pass@1, pass@k, and the tool metrics where ``rl_raw``
    names the calculator) on every held-out problem, or (``subset``) on those the RL run's periodic
    evaluations score; read as an RL run of it that is never trained."""
    import torch

    from common.config import merged
    from model.io import load_pretrained
    from training.config import config_from_dict, with_parent
    from training.distributed import DistContext
    from training.tasks.task import prepare_task
    from training.trainer import adapters_for

    raw = merged(rl_raw, {"train": {"init_from": str(run_dir)}, "rl": {"beta": 0.0},
                          "run": {"out_dir": f"{run_dir}-unused"}})  # nothing is written there
    config = with_parent(config_from_dict(copy.deepcopy(raw)))
    task = prepare_task(config, config.parent.tokenizer_file, progress=False, is_main=True,
                        device=torch.device("cpu"), adapters=adapters_for(config.train))
    if subset:
        batch_size = config.eval.batch_size or config.train.batch_size
    result = task.evaluate(load_pretrained(run_dir), batch_size=batch_size,
                           max_batches=config.eval.max_batches if subset else None,
                           device=torch.device("cpu"), amp=None, ctx=DistContext(), progress=False)
    return result.metrics
