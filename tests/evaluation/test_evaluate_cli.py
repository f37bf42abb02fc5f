"""python evaluate.py refuses bad input with one line and exit code 2, before any lm-eval work; stopped by
the filesystem or a signal, it says so in one line, loses nothing and leaves no temporary export."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from evaluation.cli import main
from refusal_testkit import one_error_line
from signal_testkit import start_paused, stop

BPB = ["--tasks", "shakespeare_bpb", "--limit", "1"]
WRITES = {"weights": ("model.safetensors", "not a safetensors file"),
          "config": ("config.yaml", "data:\n  source: [unclosed\n"),
          "files": ("config.yaml", "data:\n  source: files\n  files:\n    paths: [corpus.txt]\n")}


@pytest.mark.parametrize("damage, flags, fragments", [
    ("no-lm-eval", [], ["lm-evaluation-harness", "pip install", "lm-eval"]),
    ("missing", [], ["does not exist"]),
    ("weights", [], ["model.safetensors"]),
    ("config", [], ["config.yaml"]),
    ("files", [], ["data.source=files", "shakespeare"]),  # not trained on the plays
    (None, ["--tasks", "shakespeare_bpb,arc_easy"], ["arc_easy"]),
    (None, ["--items", "0"], ["--items"]),
    # run_testkit's model has a context of 32 tokens; a line of verse does not fit its small vocabulary.
    (None, ["--tasks", "shakespeare_next_line"], ["shakespeare_next_line", "block_size"]),
])
def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch, random_run, damage, flags, fragments):
    run = random_run.parent / "nope" if damage == "missing" else random_run
    if damage == "no-lm-eval":
        monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    elif damage in WRITES:
        name, text = WRITES[damage]
        (run / name).write_text(text)
    one_error_line(main(["--run", str(run), *flags]), *capsys.readouterr(), *fragments)


# Stopped by the filesystem or a signal


def _refused(capsys, run: Path, *fragments: str) -> None:
    one_error_line(main(["--run", str(run), *BPB]), *capsys.readouterr(), *fragments)


def _scratch(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(".minigpt-eval."))


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch) -> Path:
    """A TMPDIR of the test's own, so that what an evaluation leaves there can be seen."""
    pytest.importorskip("lm_eval")  # the tests that reach lm-eval's work; requirements-dev.txt installs it
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
