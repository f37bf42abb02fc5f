"""generate.py at the edges: near-zero temperature, and stdout closed or full (one line, exit 2)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.cli import main
from inference.sampling import sample_next_token

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_tiny_temperatures_sample_the_argmax_and_ties_share_the_draw(capsys, run_dir):
    logits = torch.tensor([[1.0, 5.0, 2.0, -3.0], [7.0, 7.0, 0.0, float("-inf")]])
    for temperature in (1e-39, 1e-30, 1e-45):
        g = torch.Generator().manual_seed(0)
        picked = sample_next_token(logits, temperature=temperature, generator=g)
        assert picked[0].item() == 1 and picked[1].item() in (0, 1)
    # Across seeds, a tie at the maximum is split between the tied ids and nothing else.
    seen = {sample_next_token(logits[1:], temperature=1e-39, generator=torch.Generator().manual_seed(s)).item()
            for s in range(32)}
    assert seen == {0, 1}
    # generate.py at a near-zero temperature prints the greedy text.
    outputs = []
    for temperature in ("0", "1e-39"):
        code = main(["--run", str(run_dir), "--prompt", "JULIET:", "--temperature", temperature,
                     "--max-new-tokens", "24", "--quiet"])
        out, err = capsys.readouterr()
        assert code == 0, err
        outputs.append(out)
    assert outputs[0] == outputs[1]


def _generate(run_dir: Path, shell_redirect: str) -> subprocess.CompletedProcess:
    command = f'"{sys.executable}" generate.py --run "{run_dir}" --prompt hi --max-new-tokens 4 {shell_redirect}'
    return subprocess.run(["bash", "-c", command], cwd=REPO, env=ENV, capture_output=False,
                          stderr=subprocess.PIPE, text=True, timeout=120)


def test_full_stdout_is_one_line_and_exit_2(run_dir, monkeypatch, capsys):
    if not Path("/dev/full").exists():
        pytest.skip("this system has no /dev/full")
    with open("/dev/full", "w") as full:  # every flush fails with ENOSPC
        monkeypatch.setattr(sys, "stdout", full)
        code = main(["--run", str(run_dir), "--prompt", "hi", "--max-new-tokens", "4"])
        monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("error: cannot write the output: ") and "No space left on device" in err[0]


def _generate_into(stdout: int, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """generate.py with ``stdout`` as its standard output (a file descriptor)."""
    return subprocess.run([sys.executable, "generate.py", *args], cwd=REPO, env=ENV, stdout=stdout,
                          stderr=subprocess.PIPE, input=stdin, timeout=120)


def _reader_gone() -> int:
    """The writing end of a pipe whose reader has already left (as `| head` does after its bytes):
    every write fails with EPIPE, from the first, however quick or slow the machine."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


def test_a_reader_that_leaves_ends_the_command_quietly_and_a_closed_stdout_is_one_line(run_dir):
    pipe = _reader_gone()
    try:
        # --quiet: the first write is the first token's text, from inside the decode loop.
        done = _generate_into(pipe, "--run", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "60", "--quiet")
    finally:
        os.close(pipe)
    assert (done.returncode, done.stderr.decode()) == (0, "")
    # Closed stdout is one line and exit 2.
    proc = _generate(run_dir, ">&-")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert proc.stderr.strip() == "error: standard output is closed; redirect it to a file or a pipe"
    # A reader that leaves the chat ends it quietly.
    pipe = _reader_gone()
    try:
        done = _generate_into(pipe, "--run", str(run_dir), "--chat", "--max-new-tokens", "5",
                              stdin=b"".join(f"line {i}\n".encode() for i in range(200)))
    finally:
        os.close(pipe)
    err = done.stderr.decode()
    assert done.returncode == 0 and err == f"chatting with {run_dir} (type a message; /help lists the commands)\n"


def test_a_full_disk_under_streamed_output_is_one_line(run_dir):
    if not Path("/dev/full").exists():
        pytest.skip("this system has no /dev/full")
    with open("/dev/full", "wb") as full:
        done = _generate_into(full.fileno(), "--run", str(run_dir), "--prompt", "ROMEO:", "--max-new-tokens", "60",
                              "--quiet")
    err = done.stderr.decode()
    assert done.returncode == 2 and err.count("\n") == 1, err[-3000:]
    assert err.startswith("error: cannot write the output: ") and "No space left on device" in err
