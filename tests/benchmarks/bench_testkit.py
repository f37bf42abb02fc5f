"""What the benchmark smoke tests share besides fixtures: running a command as a user does.

A plain module (not conftest) so tests can import it by a name no other test directory uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_python(args: list[str], cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python *args`` from the repository root, with wandb off, one torch thread and no network."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
