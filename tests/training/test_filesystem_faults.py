"""Filesystem faults the user can fix: a full disk (a real small tmpfs where this machine lets us
mount one, and a patched write everywhere), a read-only filesystem, a run directory under a file.
Each is one line naming the path and the fix, exit 2, and the last checkpoint still loads."""

import errno
import os
import subprocess
from pathlib import Path

import pytest

import train as train_cli
import rundir.metrics as metrics_module
from test_train_cli import run_cli, small_overrides
from rundir.checkpoint import load_trainer_state
from training.config import save_config
from training.trainer import train


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _args(base_raw, out: Path, steps: int, *extra: str) -> list[str]:
    sets = ["--set", "run.checkpoint_interval=2", "--set", "eval.interval=0"]
    return ["--config", "configs/tiny.yaml", "--no-progress", *extra, *small_overrides(base_raw, out, steps), *sets]


def _train(base_raw, out: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
    return run_cli(_args(base_raw, out, steps, *extra))


def _train_in_process(capsys, monkeypatch, base_raw, out: Path, steps: int) -> subprocess.CompletedProcess:
    """train.py's main in this process, read as ``_train``'s result (its command line as a process is
    proven in test_train_cli.py)."""
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # configs/tiny.yaml, as the process finds it
    code = train_cli.main(_args(base_raw, out, steps))
    out_text, err = capsys.readouterr()
    return subprocess.CompletedProcess(["train.py"], code, out_text, err)


@pytest.mark.e2e
def test_real_full_disk_during_a_checkpoint_and_during_resume(base_raw, tmp_path, mount_tmpfs):
    probe = tmp_path / "probe"
    assert _train(base_raw, probe, 2).returncode == 0
    sizes = {p.name: p.stat().st_size for p in probe.iterdir() if p.is_file()}
    # Room for one checkpoint (and a model file replaced in turn), not for a second trainer state
    # written beside the first.
    room = sum(sizes.values()) + sizes["trainer_state.pt"] // 2
    disk = mount_tmpfs(room + 16 * 1024)
    out = disk / "run"
    line = _one_error_line(_train(base_raw, out, 4))
    assert "No space left on device" in line and "the disk is full" in line and str(disk) in line
    assert load_trainer_state(out)["step"] == 2 and not list(out.glob(".*.tmp"))

    with open(disk / "filler", "wb") as f:  # take the rest, so even the metrics rewrite fails
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    line = _one_error_line(_train(base_raw, out, 4, "--resume"))
    assert "No space left on device" in line and load_trainer_state(out)["step"] == 2


@pytest.mark.e2e
def test_read_only_filesystem_is_one_line(base_raw, mount_tmpfs):
    disk = mount_tmpfs(1 << 20, read_only=True)
    line = _one_error_line(_train(base_raw, disk / "run", 2))
    assert "Read-only file system" in line and str(disk / "run") in line and "writable directory" in line


def test_run_dir_under_a_file_is_one_line(base_raw, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    line = _one_error_line(_train_in_process(capsys, monkeypatch, base_raw, blocker / "run", 2))
    assert str(blocker / "run") in line and "a part of the path is a file" in line


def test_full_disk_while_appending_metrics_is_one_line_and_keeps_the_checkpoint(make_config, monkeypatch, capsys):
    # The same fault with a patched write, for machines where no tmpfs can be mounted.
    config = make_config(train={"max_steps": 2}, eval={"interval": 0, "sample_tokens": 0})
    train(config, progress=False)

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    config_file = config.out_dir.parent / "config.yaml"
    save_config(make_config(train={"max_steps": 4}, eval={"interval": 0, "sample_tokens": 0}), config_file)
    monkeypatch.setattr(metrics_module.os, "write", full)
    code = train_cli.main(["--config", str(config_file), "--resume", "--no-progress"])
    monkeypatch.undo()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "No space left on device" in err[0] and "the disk is full" in err[0]
    assert load_trainer_state(config.out_dir)["step"] == 2
