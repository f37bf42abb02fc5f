"""train.py as a user runs it: a subprocess, exit codes, one-line errors, Ctrl-C and --resume. Signals at awkward
moments: SIGTERM or Ctrl-C inside a huge gradient accumulation stops within a micro-batch, saves and leaves the
run exactly as before the step; SIGTERM during the final validation skips it and reports what was saved. One
training per run directory (an OS lock naming its holder), leftover temporary files removed on start, and every
run file readable by the group like any other file. Filesystem faults the user can fix (a full disk: a real small
tmpfs where this machine lets us mount one, and a patched write everywhere; a read-only filesystem; a run
directory under a file): each is one line naming the path and the fix, exit 2, and the last checkpoint still
loads."""

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

import rundir.metrics as metrics_module
import train as train_cli
from refusal_testkit import one_error_line
from rundir.checkpoint import load_trainer_state
from rundir.lock import hold_run_dir
from rundir.metrics import read_metrics
from training.config import load_run_config, save_config
from training.trainer import Trainer, train

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
    one_error_line(proc.returncode, proc.stdout, proc.stderr, expected)


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


# Signals at awkward moments
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
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_signal_inside_a_million_micro_batch_step_stops_saves_and_resumes_exactly(base_raw, tmp_path, signum):
    out = tmp_path / "run"
    huge = ["--set", "train.grad_accum_steps=1000000", "--set", "eval.interval=0"]
    args = ["--config", "configs/tiny.yaml", *small_overrides(base_raw, out, 1), *huge]
    proc = start_cli(args)
    try:
        for line in proc.stdout:  # the setup line comes once the loop is about to start
            if line.startswith("training "):
                break
        _wait_for_sigterm_handler(proc.pid)  # the loop's handlers (SIGINT's too), installed just after that line
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signum, stderr
    assert "stopped at step 0; checkpoint saved" in stderr and "--resume" in stderr and "Traceback" not in stderr

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
    a, b = (load_file(str(run / "model.safetensors")) for run in (out, fresh_dir))
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


# One training per run directory
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


# Filesystem faults
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
    proven above)."""
    monkeypatch.chdir(REPO)  # configs/tiny.yaml, as the process finds it
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
