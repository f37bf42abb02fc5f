"""evaluate.py stopped by the filesystem or a signal: one line, nothing lost, no temporary export left."""

import errno
import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from evaluation.cli import main
from refusal_testkit import one_error_line
from signal_testkit import start_paused, stop

BPB = ["--tasks", "shakespeare_bpb", "--limit", "1"]

pytest.importorskip("lm_eval")  # optional: requirements-dev.txt installs it


def _refused(capsys, run: Path, *fragments: str) -> None:
    one_error_line(main(["--run", str(run), *BPB]), *capsys.readouterr(), *fragments)


def _scratch(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(".minigpt-eval."))


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch) -> Path:
    """A TMPDIR of the test's own, so that what an evaluation leaves there can be seen."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def test_a_read_only_run_or_a_full_tmpdir_is_one_line(capsys, random_run, mount_tmpfs, tmpdir_env, monkeypatch):
    disk = mount_tmpfs(16 << 20)
    run = Path(shutil.copytree(random_run, disk / "run"))
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    _refused(capsys, run, str(run / "eval"), "Read-only file system")
    assert _scratch(tmpdir_env) == []
    # A full TMPDIR.
    disk = mount_tmpfs(64 << 10)  # smaller than the export's weights
    monkeypatch.setattr(tempfile, "tempdir", str(disk))
    _refused(capsys, random_run, "TMPDIR", str(disk), "No space left on device")
    assert list(disk.iterdir()) == []
    assert not (random_run / "eval").exists()


def test_eval_as_a_file_or_a_disk_that_fills_is_one_line_and_keeps_what_was_there(capsys, random_run, tmpdir_env,
                                                                                   monkeypatch):
    import evaluation.tasks

    (random_run / "eval").write_text("my notes")
    _refused(capsys, random_run, str(random_run / "eval"), "is a file")
    assert (random_run / "eval").read_text() == "my notes"
    assert _scratch(tmpdir_env) == []
    (random_run / "eval").unlink()
    (random_run / "eval").mkdir()
    (random_run / "eval" / "results.json").write_text('{"earlier": true}')
    written = []

    def fills(path, text):
        if written:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a failed write() reports it
        written.append(path)
        path.write_text(text)

    monkeypatch.setattr(evaluation.tasks, "atomic_write_text", fills)
    _refused(capsys, random_run, str(random_run / "eval"), "the disk is full")
    assert (random_run / "eval" / "results.json").read_text() == '{"earlier": true}'
    assert _scratch(tmpdir_env) == []


def _start_paused_evaluation(run: Path, tmp: Path, marker: Path) -> subprocess.Popen:
    """evaluate.py, paused where lm-eval would run (the temporary export made) until it is signalled."""
    script = textwrap.dedent(f"""
        import pathlib, sys, time
        import evaluation.runner as runner
        from evaluation.cli import main

        def paused(*args, **kwargs):
            pathlib.Path({str(marker)!r}).touch()
            time.sleep(60)

        runner.run_lm_eval = paused
        sys.exit(main(["--run", {str(run)!r}, *{BPB!r}]))
    """)
    return start_paused(["-c", script], marker, env={**os.environ, "TMPDIR": str(tmp)})


# Ctrl-C and SIGTERM take one path, common.cli.run_stoppable (tests/common/test_stoppable.py proves
# both): this command's SIGTERM case runs with the slow tests.
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130),
                                          pytest.param(signal.SIGTERM, 143, marks=pytest.mark.e2e)],
                         ids=["ctrl-c", "sigterm"])
def test_interrupt_exits_quietly_and_removes_the_temporary_export(random_run, tmpdir_env, tmp_path, signum, code):
    process = _start_paused_evaluation(random_run, tmpdir_env, tmp_path / "marker")
    assert len(_scratch(tmpdir_env)) == 1
    returncode, err = stop(process, signum)
    assert returncode == code and "Traceback" not in err and err.strip() == "", err
    assert _scratch(tmpdir_env) == []


def test_a_sigkill_leftover_is_removed_by_the_next_evaluation(capsys, random_run, tmpdir_env, tmp_path):
    process = _start_paused_evaluation(random_run, tmpdir_env, tmp_path / "marker")
    process.kill()
    process.communicate(timeout=60)
    assert len(_scratch(tmpdir_env)) == 1
    # Refused once its own temporary export is made: a damaged config.
    (random_run / "config.yaml").write_text("data:\n  source: files\n")
    _refused(capsys, random_run, "config.yaml is damaged")
    assert _scratch(tmpdir_env) == []
