"""What the benchmark smoke tests share besides fixtures: running a command as a user does."""

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def benchmark_scripts() -> list[str]:
    """The module names of benchmarks/ that are commands (``python -m benchmarks.NAME``); the
    package's __init__ and its shared helpers have no command line."""
    return sorted(path.stem for path in (ROOT / "benchmarks").glob("*.py")
                  if 'if __name__ == "__main__":' in path.read_text())


def run_python(args: list[str], cwd: Path = ROOT, timeout: float = 300, env: dict[str, str] | None = None,
               ) -> subprocess.CompletedProcess:
    """``python *args`` from the repository root, wandb off, one torch thread, no network, ``env`` added.
    Past ``timeout`` (or interrupted) its whole process group is killed: no server or worker is left."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", **(env or {}))
    with subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, text=True, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
