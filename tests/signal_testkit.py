"""Starting a command line that pauses at a point the test chose, and signalling it there."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def start_paused(args: list[str], marker: Path, **popen) -> subprocess.Popen:
    """``python *args`` in the repository root, returned once it has touched ``marker``."""
    # A shell without job control starts background jobs with SIGINT ignored, and a child inherits
    # that (Python then installs no KeyboardInterrupt): give the command Ctrl-C's default back.
    process = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **popen)
    deadline = time.monotonic() + 120
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the command never reached its pause: {process.communicate()[1][-2000:]}")
        time.sleep(0.02)
    return process


def stop(process: subprocess.Popen, signum: int) -> tuple[int, str]:
    """Send ``signum`` and wait: the exit code and stderr (the process is killed if it lingers)."""
    try:
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, err
