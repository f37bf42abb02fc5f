"""train.py as a user runs it: a subprocess, exit codes, one-line errors, Ctrl-C and --resume."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import train as train_cli
from rundir.checkpoint import load_trainer_state
from rundir.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]


def small_overrides(base_raw: dict, out_dir: Path, max_steps: int) -> list[str]:
    data = base_raw["data"]
    sets = [
        f"train.max_steps={max_steps}", f"run.out_dir={out_dir}", "logging.wandb.mode=disabled",
        # Shrink tiny.yaml's model and point it at the session corpus so the run takes seconds.
        "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.n_kv_head=1", "model.block_size=32",
        "train.batch_size=8", "train.warmup_steps=2", "train.peak_flops=1e11", "train.device=cpu",
        "data.source=files", f"data.vocab_size={data['vocab_size']}", f"data.cache_dir={data['cache_dir']}",
        f"data.files.paths=[{data['files']['paths'][0]}]", "data.files.txt_document=paragraph",
        "eval.interval=5", "eval.max_batches=2", "eval.final_max_batches=2", "eval.sample_tokens=8", "logging.interval=1",
    ]
    return [arg for s in sets for arg in ("--set", s)]


# One intra-op thread: see one_torch_thread in conftest.py.
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120
    )


def start_cli(args: list[str]) -> subprocess.Popen:
    """train.py started in the background, its output piped as text."""
    return subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_records(path: Path, count: int, proc: subprocess.Popen, timeout: float = 90) -> None:
    """Block until the metrics file ``path`` of the running ``proc`` holds ``count`` records."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(read_metrics(path)) >= count:
            return
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.1)
    raise AssertionError(f"{path} never reached {count} records")


@pytest.mark.e2e
def test_train_cli_end_to_end(base_raw, tmp_path):
    out = tmp_path / "run"
    proc = run_cli(["--config", "configs/tiny.yaml", "--no-progress", *small_overrides(base_raw, out, 6)])
    assert proc.returncode == 0, proc.stderr
    assert "done: 6 steps" in proc.stdout
    for name in ("config.yaml", "tokenizer.json", "model_config.json", "model.safetensors", "trainer_state.pt"):
        assert (out / name).is_file(), name
    kinds = [(r["kind"], r["step"]) for r in read_metrics(out / "metrics.jsonl")]
    assert kinds[-1] == ("final_eval", 6) and ("eval", 5) in kinds


@pytest.mark.e2e
def test_ctrl_c_saves_and_resume_finishes(base_raw, tmp_path):
    out = tmp_path / "run"
    proc = start_cli(["--config", "configs/tiny.yaml", "--no-progress", *small_overrides(base_raw, out, 100000)])
    wait_for_records(out / "metrics.jsonl", 3, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert "checkpoint saved" in stderr and "--resume" in stderr and "Traceback" not in stderr
    assert (saved := load_trainer_state(out)["step"]) >= 3

    finish = run_cli(["--config", "configs/tiny.yaml", "--no-progress", "--resume", *small_overrides(base_raw, out, saved + 2)])
    assert finish.returncode == 0, finish.stderr
    assert f"done: {saved + 2} steps" in finish.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        # Both are refused in-process too (tests/training/test_training_config.py); as a process,
        # the config that loads and is then refused by default, the missing file with the slow tests.
        pytest.param(["--config", "configs/no_such.yaml"], "no_such.yaml", marks=pytest.mark.e2e),
        (["--config", "configs/tiny.yaml", "--set", "model.n_kv_head=3"], "n_kv_head"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, expected):
    # The other user errors share this path; they are checked in-process (faster).
    proc = run_cli(args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_the_threads_flag_is_credited_and_a_llama_shaped_run_is_offered_its_exports(base_raw, tmp_path, capsys,
                                                                                    positions):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**base_raw, "model": {**base_raw["model"], "positions": positions},
                                      "train": {**base_raw["train"], "max_steps": 1},
                                      "eval": {**base_raw["eval"], "sample_tokens": 0},
                                      "run": {"out_dir": str(tmp_path / "run")}}))
    assert train_cli.main(["--config", str(config), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    hints = out.split("next:")[1]
    assert "1 thread (--threads)" in out and ("--format llama" in hints and "--format gguf" in hints) == (
        positions == "rope")
