"""Crash consistency: training killed with SIGKILL at many random moments (some of them inside
checkpoint writes) and resumed each time ends with exactly the weights of an uninterrupted run,
and after every kill each file in the run directory loads."""

import copy
import multiprocessing
import os
import random
import signal
from pathlib import Path

import pytest
import torch

from rundir.files import STATE_FILE
from crash_testkit import attempt
from data.tokenizer import load_tokenizer
from model.io import load_pretrained
from rundir.checkpoint import load_trainer_state
from rundir.metrics import read_metrics
from training.config import load_run_config

KILLS = 24
MAX_STEPS = 10


def _raw(base_raw: dict, out_dir: Path) -> dict:
    raw = copy.deepcopy(base_raw)
    raw["model"] = {"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 16, "block_size": 16}
    raw["train"].update(max_steps=MAX_STEPS, batch_size=4, warmup_steps=2)
    raw["eval"] = {"interval": 4, "max_batches": 1, "sample_tokens": 0, "final_max_batches": 1}
    raw["run"] = {"checkpoint_interval": 1, "out_dir": str(out_dir)}
    return raw


def _forkserver(monkeypatch: pytest.MonkeyPatch):
    """A forkserver that has imported torch and the trainer once; every attempt forks from it. A fresh
    interpreter, it finds modules through PYTHONPATH and never runs a torch op, so forking it is safe."""
    here = Path(__file__).resolve().parent
    paths = [str(here.parents[1]), str(here), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["crash_testkit"])
    return ctx


def _run(ctx, raw: dict, *, kill_after_s: float | None = None, kill_at_write: int | None = None) -> int:
    out = Path(raw["run"]["out_dir"])
    resume = (out / STATE_FILE).is_file()
    proc = ctx.Process(target=attempt, args=(raw, resume, not resume, kill_at_write))
    proc.start()
    try:
        proc.join(kill_after_s if kill_after_s is not None else 120)
        if proc.is_alive() and kill_after_s is not None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(30)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
    return proc.exitcode


def _check_every_file_loads(out: Path) -> None:
    # The model files are written before the trainer state (the commit point), so once a
    # checkpoint exists they always load; a kill inside the very first save may leave the
    # weights without their config, which load_pretrained refuses loudly and --overwrite clears.
    if (out / STATE_FILE).exists() or all((out / name).exists() for name in ("model.safetensors", "model_config.json")):
        load_pretrained(out)
    if (out / STATE_FILE).exists():
        load_trainer_state(out)
    if (out / "metrics.jsonl").exists():
        read_metrics(out / "metrics.jsonl")
    if (out / "config.yaml").exists():
        load_run_config(out / "config.yaml")
    if (out / "tokenizer.json").exists():
        load_tokenizer(out / "tokenizer.json")


@pytest.mark.e2e  # whole runs killed at random moments and resumed: the slowest of the default suite
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(base_raw, tmp_path, monkeypatch):
    ctx = _forkserver(monkeypatch)
    reference = tmp_path / "reference"
    assert _run(ctx, _raw(base_raw, reference)) == 0
    out = tmp_path / "killed"
    raw = _raw(base_raw, out)
    rng = random.Random(19)
    kills = by_write = 0
    while kills < KILLS:
        if kills % 2:  # inside the n-th atomic write of this attempt
            code = _run(ctx, raw, kill_at_write=rng.randint(1, 12))
            by_write += code == -signal.SIGKILL
        else:
            code = _run(ctx, raw, kill_after_s=rng.uniform(0.05, 1.5))
        if code == 0:  # finished before the kill came: start the run again from scratch
            for path in out.iterdir():
                path.unlink()
            continue
        assert code == -signal.SIGKILL, code
        kills += 1
        _check_every_file_loads(out)
    assert _run(ctx, raw) == 0
    assert by_write >= KILLS // 4

    ref, got = load_pretrained(reference).state_dict(), load_pretrained(out).state_dict()
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == list(range(1, MAX_STEPS + 1))
    assert not list(out.glob(".*.tmp"))
