"""What the end-to-end tests share: running a command line as a user does, and the train.py
settings that keep a run to seconds.

A plain module (not conftest) so tests can import it by a name no other test directory uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_command(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python *args`` in a subprocess, with wandb off and one torch thread."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def quick_settings(tmp_path: Path) -> list[str]:
    """train.py overrides for a run of a few steps: its own data cache, no wandb, short evaluations."""
    return ["--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "logging.wandb.mode=disabled",
            "--set", "train.max_minutes=null", "--set", "train.peak_flops=1e11", "--set", "eval.max_batches=1",
            "--set", "eval.final_max_batches=2", "--set", "eval.sample_tokens=4", "--no-progress"]
