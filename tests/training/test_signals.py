"""Signals at awkward moments: SIGTERM inside a huge gradient accumulation stops within a
micro-batch and leaves the run exactly as before the step; SIGTERM during the final validation
skips it and reports what was saved."""

import os
import signal
import time

import pytest
import torch
from safetensors.torch import load_file

from test_train_cli import run_cli, small_overrides, start_cli
from rundir.checkpoint import load_trainer_state
from training.config import load_run_config
from training.trainer import Trainer, train


def _weights(run_dir):
    return load_file(str(run_dir / "model.safetensors"))


def _wait_for_sigterm_handler(pid: int, timeout: float = 60.0) -> None:
    """Block until process ``pid`` catches SIGTERM (its SigCgt mask in /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never installed a SIGTERM handler")


@pytest.mark.e2e
def test_sigterm_inside_a_million_micro_batch_step_stops_and_resumes_exactly(base_raw, tmp_path):
    out = tmp_path / "run"
    huge = ["--set", "train.grad_accum_steps=1000000", "--set", "eval.interval=0"]
    args = ["--config", "configs/tiny.yaml", *small_overrides(base_raw, out, 1), *huge]
    proc = start_cli(args)
    try:
        for line in proc.stdout:  # the setup line comes once the loop is about to start
            if line.startswith("training "):
                break
        _wait_for_sigterm_handler(proc.pid)  # the loop's handler, installed just after that line
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "stopped at step 0; checkpoint saved" in stderr and "Traceback" not in stderr

    # The abandoned step consumed batches and random numbers; both were put back, so resuming
    # with a small accumulation equals a fresh run with it, bit for bit.
    small = ["--set", "train.grad_accum_steps=2", "--set", "eval.interval=0"]
    resumed = run_cli(["--config", "configs/tiny.yaml", "--no-progress", "--resume", *small_overrides(base_raw, out, 2), *small])
    assert resumed.returncode == 0, resumed.stderr
    fresh_dir = tmp_path / "fresh"  # the same config, trained from scratch in this process
    config = load_run_config(out / "config.yaml", [f"run.out_dir={fresh_dir}"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the CLI's processes (OMP_NUM_THREADS=1): the same sums
    try:
        assert train(config, progress=False).step == 2
    finally:
        torch.set_num_threads(threads)
    a, b = _weights(out), _weights(fresh_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_during_final_validation_skips_it_and_reports_the_checkpoint(make_config, monkeypatch):
    original = Trainer._evaluate

    def evaluate_then_signal(self, *, final):
        if final:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, final=final)

    monkeypatch.setattr(Trainer, "_evaluate", evaluate_then_signal)
    config = make_config(train={"max_steps": 2}, eval={"interval": 0, "sample_tokens": 0})
    result = train(config, progress=False)
    assert result.interrupted and result.signal == signal.SIGTERM and result.val_loss is None
    assert result.step == load_trainer_state(config.out_dir)["step"] == 2
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone: the default action is back
