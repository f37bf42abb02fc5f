"""One training per run directory (an OS lock naming its holder), leftover temporary files
removed on start, and every run file readable by the group like any other file."""

import os
import socket
import subprocess
import sys

import pytest

from test_train_cli import ENV, REPO, run_cli, small_overrides, start_cli, wait_for_records
from rundir.lock import hold_run_dir
from rundir.metrics import read_metrics
from training.trainer import train


@pytest.mark.e2e
def test_second_training_is_refused_naming_the_holder_and_kill_9_leaves_no_stale_lock(base_raw, tmp_path):
    out = tmp_path / "run"
    first = start_cli(["--config", "configs/tiny.yaml", "--no-progress", *small_overrides(base_raw, out, 100000)])
    try:
        wait_for_records(out / "metrics.jsonl", 2, first)
        for extra in ([], ["--overwrite"]):  # --resume takes the same lock, before anything else
            second = run_cli(["--config", "configs/tiny.yaml", "--no-progress", *extra, *small_overrides(base_raw, out, 5)])
            lines = second.stderr.strip().splitlines()
            assert second.returncode == 2 and len(lines) == 1 and "in use by another training" in lines[0], second.stderr
            assert f"pid {first.pid}" in lines[0] and socket.gethostname() in lines[0]
        # The refused runs wrote nothing: every step is logged once, by the first run.
        first.kill()  # SIGKILL: the kernel releases the lock with the process
        first.communicate(timeout=30)
        steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
        assert steps == sorted(set(steps)) and (out / "config.yaml").is_file()
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    with hold_run_dir(out):  # the killed holder left no stale lock
        pass


def test_lock_is_exclusive_across_processes(tmp_path):
    # Within one process, and its release: tests/rundir/test_rundir_lock.py.
    run_dir = tmp_path / "run"
    with hold_run_dir(run_dir):
        probe = subprocess.run(
            [sys.executable, "-c", "import sys; from pathlib import Path; from rundir.lock import hold_run_dir\n"
             "with hold_run_dir(Path(sys.argv[1])): pass", str(run_dir)],
            cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60,
        )
        assert probe.returncode != 0 and "RunDirectoryBusy" in probe.stderr and f"pid {os.getpid()}" in probe.stderr


def test_run_files_get_the_same_mode_and_leftover_temporary_files_are_removed_on_resume(make_config):
    config = make_config(train={"max_steps": 2}, eval={"interval": 0, "sample_tokens": 0})
    train(config, progress=False)
    umask = os.umask(0o022)
    os.umask(umask)
    for name in ("model.safetensors", "model_config.json", "trainer_state.pt", "config.yaml", "tokenizer.json"):
        assert (config.out_dir / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    leftovers = [config.out_dir / ".trainer_state.pt.k3j2.tmp", config.out_dir / ".model.safetensors.x9.tmp"]
    for path in leftovers:
        path.write_bytes(b"\0" * 1000)
    keep = config.out_dir / "notes.tmp"  # not an atomic-write leftover: never touched
    keep.write_text("mine")
    train(make_config(train={"max_steps": 3}, eval={"interval": 0, "sample_tokens": 0}), resume=True, progress=False)
    assert not any(path.exists() for path in leftovers) and keep.read_text() == "mine"
