"""Launching command lines as one process or under torchrun on the CPU, and reading what each rank said."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from server_process import free_port

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_env() -> dict[str, str]:
    """The test's environment for a torchrun child: repo importable, one thread per process
    (two ranks on a shared 2-core machine), and no torchrun variables leaking in."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return env


def torchrun(nproc: int, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", *args]


def launch(nproc: int, args: list[str], timeout: int = 240, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    """``args`` (a script and its arguments) as one process, or under torchrun with ``nproc`` processes."""
    cmd = [sys.executable, *args] if nproc == 1 else torchrun(nproc, args)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env or torchrun_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def train_args(overrides: list[str], out: Path, *more: str) -> list[str]:
    """train.py on configs/tiny.yaml with ``overrides`` (conftest's small_overrides), 2 layers, 4 steps
    and a checkpoint every 2, into ``out``."""
    sets = [*overrides, "model.n_layer=2", "train.max_steps=4", "run.checkpoint_interval=2",
            "logging.wandb.mode=disabled", f"run.out_dir={json.dumps(str(out))}", *more]
    return ["train.py", "--config", "configs/tiny.yaml", "--no-progress", *[a for s in sets for a in ("--set", s)]]


def every_rank_says_one_line(proc: subprocess.CompletedProcess, nproc: int = 2) -> str:
    """The one ``error:`` line that each of ``nproc`` ranks printed (the same), with no traceback
    through this repository's code (torchrun reports the failed workers in its own words)."""
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == nproc and len(set(lines)) == 1, output[-3000:]
    # (A virtual environment inside the checkout holds torchrun's own frames: those are not ours.)
    ours = re.compile(rf'File "{re.escape(str(ROOT))}/(?!\.venv/)')
    assert not ours.search(output) and "Connection closed" not in output, output[-3000:]
    return lines[0]
