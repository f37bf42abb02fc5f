"""Start ``serve.py`` as a real process on a free 127.0.0.1 port, and always stop it."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Server:
    base: str  # http://127.0.0.1:PORT
    process: subprocess.Popen
    log: Path  # everything the server printed (a file, not a pipe: a full pipe would stall it)

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@contextlib.contextmanager
def running_server(run_dir: Path, *extra: str, timeout_s: float = 60) -> Iterator[Server]:
    """Yield the server once /health answers; kill the process however the block ends."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "serve.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "serve.py", "--run", str(run_dir), "--port", str(port), "--device", "cpu", *extra],
                cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                # A shell without job control starts background jobs with Ctrl-C ignored, and a
                # child inherits that: give the server Ctrl-C's default, as a terminal would.
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        server = Server(f"http://127.0.0.1:{port}", process, log)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"serve.py exited with {process.returncode}: {server.output()}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{server.base}/health", timeout=1).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("serve.py did not answer /health in time")
                time.sleep(0.05)
            yield server
        finally:
            process.kill()
            process.wait(timeout=30)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")
