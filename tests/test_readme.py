"""Every ``bash`` and ``python`` block of README.md, run as written, top to bottom, in one sandbox.

The sandbox is a temporary folder holding links to the repository's files, so that what the
commands write (``runs/``, ``exports/``, ``data_cache/``) lands there and blocks share it as a
reader following the README would: the runs the first blocks train are the ones the later blocks
sample, export and serve. A block preceded by ``<!-- readme-test: skip (reason) -->`` is not run;
the README marks only those that need the network, GPUs, or the whole test suite.

What the test changes, and nothing else:

| as written | as run | why |
|---|---|---|
| ``python`` | this interpreter | the environment under test |
| ``pip install ...`` | nothing | the environment under test is already installed |
| ``python train.py ...`` | the same, then ``TRAIN_BUDGET`` appended | a few steps instead of minutes; later ``--set`` flags win |
| ``python train.py ... --resume`` | the same, then ``RESUME_BUDGET`` appended | a few more steps than the run it continues |
| ``python serve.py ...`` | the same with ``--port`` a free port, started in the background until the test ends | it never exits; another test may hold port 8000 |
| ``127.0.0.1:8000`` in a block | the same free port | as above |
| ``input.txt``, ``corpus/*.jsonl`` | written by the test from the embedded plays | the README means your own files |

Each block must exit with status 0 and print something: a snippet that shows the reader nothing
has not shown what it claims.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from server_process import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP = re.compile(r"<!--\s*readme-test:\s*skip\s*\((?P<reason>[^)]*)\)\s*-->")
FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.M | re.S)
TRAIN_BUDGET = [
    "--set", "train.max_steps=3", "--set", "train.batch_size=4", "--set", "eval.max_batches=1",
    "--set", "eval.final_max_batches=2", "--set", "eval.interval=0", "--set", "logging.wandb.mode=disabled",
    "--no-progress",
]
# A resume continues a run the budget above finished: only a larger budget has steps left.
RESUME_BUDGET = [*TRAIN_BUDGET, "--set", "train.max_steps=5"]
NOT_LINKED = {".git", ".venv", "runs", "exports", "data_cache", "compile_cache", "wandb", ".ci-cache", ".pytest_cache"}


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # where the block starts in README.md, for failure messages
    skip: str | None  # the reason the README gives, or None to run it


def readme_blocks(text: str) -> list[Block]:
    """The README's bash and python blocks in order; others (output samples, diagrams) are text."""
    blocks = []
    for found in FENCE.finditer(text):
        if found["lang"] not in ("bash", "python"):
            continue
        before = text[: found.start()].rstrip().splitlines()
        marker = SKIP.fullmatch(before[-1].strip()) if before else None
        line = text.count("\n", 0, found.start()) + 1
        blocks.append(Block(found["lang"], found["body"], line, marker["reason"] if marker else None))
    return blocks


def test_readme_blocks_are_found_and_every_skip_says_why():
    blocks = readme_blocks(README.read_text(encoding="utf-8"))
    assert sum(b.lang == "bash" and b.skip is None for b in blocks) >= 5
    assert sum(b.lang == "python" and b.skip is None for b in blocks) >= 2
    assert all(b.skip.strip() for b in blocks if b.skip is not None)
    # A marker counts only directly above a block: one anywhere else is a mistake.
    assert README.read_text(encoding="utf-8").count("<!-- readme-test:") == sum(b.skip is not None for b in blocks)


class Sandbox:
    """A folder that looks like the repository to the README's commands; owns the servers they start."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.servers: list[subprocess.Popen] = []
        for entry in ROOT.iterdir():
            if entry.name not in NOT_LINKED:
                (root / entry.name).symlink_to(entry)
        bin_dir = root / ".bin"
        bin_dir.mkdir()
        # A script, not a link: a virtual environment's interpreter finds its packages by its own path.
        (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (bin_dir / "python").chmod(0o755)
        self.env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONUNBUFFERED="1",
                        WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
        self._write_corpus()

    def _write_corpus(self) -> None:
        from data.sources.shakespeare import shakespeare_documents

        corpus = self.root / "corpus"
        corpus.mkdir()
        _, texts = shakespeare_documents()
        with open(corpus / "plays.jsonl", "w", encoding="utf-8") as f:
            for text in texts[:4]:
                f.write(json.dumps({"text": text}) + "\n")
        (self.root / "input.txt").write_text("\n\n".join(texts[:2]), encoding="utf-8")

    def run(self, block: Block) -> subprocess.CompletedProcess | None:
        """The block's result; None for a block that only started servers."""
        code = block.code.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")
        if block.lang == "python":
            script = self.root / f".block-{block.line}.py"
            script.write_text(code, encoding="utf-8")
            command = [sys.executable, str(script)]
        else:
            shell = self._shell(code)
            if shell is None:
                return None
            command = ["bash", "-c", shell]
        return subprocess.run(command, cwd=self.root, env=self.env, capture_output=True, text=True,
                              timeout=900, stdin=subprocess.DEVNULL)

    def _shell(self, code: str) -> str | None:
        script = []
        for command in code.replace("\\\n", " ").splitlines():
            if command.lstrip().startswith("python serve.py"):
                self._start_server(command.split("#")[0].split()[1:])
            elif command.split("#")[0].strip():
                script.append(command)
        if not script:
            return None
        budget, resume_budget = " ".join(TRAIN_BUDGET), " ".join(RESUME_BUDGET)
        prelude = f"""set -euo pipefail
pip() {{ :; }}
python() {{
  if [ "${{1:-}}" != train.py ]; then command python "$@"
  elif [[ " $* " == *" --resume "* ]]; then command python "$@" {resume_budget}
  else command python "$@" {budget}; fi
}}
"""
        return prelude + "\n".join(script)

    def _start_server(self, args: list[str]) -> None:
        log = open(self.root / f".server-{len(self.servers)}.log", "w")
        server = subprocess.Popen([sys.executable, *args, "--port", str(self.port)], cwd=self.root, env=self.env,
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.servers.append(server)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if server.poll() is not None:
                pytest.fail(f"serve.py exited: {(self.root / log.name).read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return
            except OSError:
                time.sleep(0.2)
        pytest.fail("serve.py did not answer /health")

    def stop(self) -> None:
        for server in self.servers:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.mark.e2e
def test_every_readme_block_runs_as_written(tmp_path):
    sandbox = Sandbox(tmp_path)
    try:
        for block in readme_blocks(README.read_text(encoding="utf-8")):
            if block.skip is not None:
                continue
            started = time.monotonic()
            done = sandbox.run(block)
            where = f"README.md line {block.line} ({block.lang})"
            print(f"{where}: {time.monotonic() - started:.1f} s")  # shown with -s, to keep this test cheap
            if done is None:
                continue
            assert done.returncode == 0, f"{where} failed:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}"
            assert done.stdout.strip(), f"{where} printed nothing:\n{done.stderr[-2000:]}"
    finally:
        sandbox.stop()
