"""export.py stopped by the filesystem or a signal: one line, the previous export intact, nothing hidden left."""

import errno
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from export_testkit import assert_one_line_error, export_in_process, read_json
from signal_testkit import start_paused, stop


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_overwrite_on_a_read_only_filesystem_keeps_the_export(make_export, mount_tmpfs, capsys):
    run_dir, _ = make_export()
    disk = mount_tmpfs(1 << 20)
    assert export_in_process(capsys, "--run", str(run_dir), "--out", str(disk / "export")).returncode == 0
    before = {p.name: p.read_bytes() for p in (disk / "export").iterdir()}
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    done = export_in_process(capsys, "--run", str(run_dir), "--out", str(disk / "export"), "--overwrite")
    assert "Read-only file system" in assert_one_line_error(done)
    assert {p.name: p.read_bytes() for p in (disk / "export").iterdir()} == before


def _full(path, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a failed write() reports it


@pytest.mark.parametrize("disk, fragments", [
    ("read-only", ["{parent}", "Read-only file system", "choose a writable directory"]),
    ("half-the-weights", ["{parent}", "No space left on device", "the disk is full"]),
    # The same without a mount, which some machines do not allow: the weights' write fails.
    ("no-mount", ["{parent}/export: ", "the disk is full"]),
])
def test_a_disk_that_cannot_take_the_export_is_one_line_and_leaves_nothing(make_export, mount_tmpfs, tmp_path,
                                                                          monkeypatch, capsys, disk, fragments):
    import exporting.hf.writer

    run_dir, folder = make_export()
    if disk == "no-mount":
        monkeypatch.setattr(exporting.hf.writer, "atomic_write_bytes", _full)
        parent = tmp_path
    else:
        size = (folder / "model.safetensors").stat().st_size // 2 if disk == "half-the-weights" else 1 << 20
        parent = mount_tmpfs(size, read_only=disk == "read-only")
    done = export_in_process(capsys, "--run", str(run_dir), "--out", str(parent / "export"))
    assert_one_line_error(done, *[fragment.replace("{parent}", str(parent)) for fragment in fragments])
    assert list(parent.iterdir()) == []


def _start_paused_export(run_dir: Path, out: Path, marker: Path, release: Path | None = None) -> subprocess.Popen:
    """export.py, paused mid-write (config.json written, the rest not) until it is signalled, or
    until ``release`` exists."""
    script = textwrap.dedent(f"""
        import pathlib, sys, time
        import exporting.hf.writer as writer
        from exporting.cli import main

        write = writer.write_json

        def paused(path, content):
            write(path, content)
            if path.name == "config.json":
                pathlib.Path({str(marker)!r}).touch()
                release = {str(release) if release else None!r}
                for _ in range(1200):
                    if release and pathlib.Path(release).exists():
                        break
                    time.sleep(0.05)

        writer.write_json = paused
        sys.exit(main(["--run", {str(run_dir)!r}, "--out", {str(out)!r}]))
    """)
    return start_paused(["-c", script], marker)


# Ctrl-C and SIGTERM take one path, common.cli.run_stoppable (tests/common/test_stoppable.py proves
# both): this command's SIGTERM case runs with the slow tests.
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130),
                                          pytest.param(signal.SIGTERM, 143, marks=pytest.mark.e2e)],
                         ids=["ctrl-c", "sigterm"])
def test_interrupt_during_the_write_exits_quietly_and_cleans_up(make_export, tmp_path, signum, code):
    run_dir, _ = make_export()
    parent = tmp_path / "exports"
    process = _start_paused_export(run_dir, parent / "tiny", tmp_path / "marker")
    assert _hidden(parent)  # the half-written folder exists
    returncode, err = stop(process, signum)
    assert returncode == code, err
    assert "Traceback" not in err and err.strip() == "", err
    assert list(parent.iterdir()) == []


# A real kill (a process, seconds): with the slow tests. The default suite proves the clean-up it
# relies on in-process, on leftovers named as a killed export leaves them:
# test_leftovers_of_running_exports_stay_and_an_interrupted_swap_is_undone.
@pytest.mark.e2e
def test_a_sigkill_leftover_is_removed_by_the_next_export(make_export, tmp_path, capsys):
    run_dir, _ = make_export()
    parent = tmp_path / "exports"
    process = _start_paused_export(run_dir, parent / "tiny", tmp_path / "marker")
    process.kill()
    process.communicate(timeout=60)
    leftover = _hidden(parent)
    assert len(leftover) == 1 and leftover[0].endswith(".tmp")

    assert export_in_process(capsys, "--run", str(run_dir), "--out", str(parent / "other")).returncode == 0
    assert sorted(p.name for p in parent.iterdir()) == ["other"]


def test_leftovers_of_running_exports_stay_and_an_interrupted_swap_is_undone(make_export, tmp_path):
    from exporting.hf import export_run

    run_dir, folder = make_export()
    parent = tmp_path / "exports"
    parent.mkdir()
    gone = 2**22 + 12345  # above Linux's largest pid: no process has it
    running = parent / f".busy.{os.getpid()}-{'a' * 12}.tmp"
    dead = parent / f".busy.{gone}-{'b' * 12}.tmp"
    # Killed between publish's two renames: the previous export was moved aside, and the new
    # one never arrived.
    swapped = parent / f".previous.{gone}-{'c' * 12}.old"
    for path in (running, dead):
        path.mkdir()
    subprocess.run(["cp", "-r", str(folder), str(swapped)], check=True)
    not_ours = parent / ".notes"
    not_ours.mkdir()

    export_run(run_dir, parent / "new")
    assert _hidden(parent) == sorted([running.name, not_ours.name])
    assert read_json(parent / "previous" / "config.json") == read_json(folder / "config.json")
    assert (parent / "new" / "model.safetensors").is_file()


# Two processes (seconds): with the slow tests. The default suite proves the refusal it ends in
# with test_a_folder_that_appears_during_the_export_is_never_replaced, in-process.
@pytest.mark.e2e
def test_two_exports_to_one_new_folder_cannot_both_succeed(make_export, tmp_path):
    """Both pass the check at the start and wait, then publish at once: one wins, one says so."""
    run_dir, _ = make_export()
    out, release = tmp_path / "exports" / "tiny", tmp_path / "go"
    processes = [_start_paused_export(run_dir, out, tmp_path / f"marker{i}", release) for i in range(2)]
    release.touch()
    try:
        done = [process.communicate(timeout=120) + (process.returncode,) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert sorted(code for _, _, code in done) == [0, 2], done
    loser = next(err for _, err, code in done if code == 2)
    assert loser.startswith("error: ") and len(loser.strip().splitlines()) == 1 and "appeared while" in loser
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize("overwrite", [False, True], ids=["new", "overwrite"])
@pytest.mark.parametrize("content", ["a file", "empty"])
def test_a_folder_that_appears_during_the_export_is_never_replaced(make_export, tmp_path, monkeypatch, capsys,
                                                                    overwrite, content):
    """Only --overwrite of an empty folder may take its place: nothing is lost then."""
    import exporting.hf.writer as writer

    run_dir, _ = make_export()
    out = tmp_path / "out"
    write = writer.write_json

    def someone_makes_the_folder(path, data):
        write(path, data)
        if path.name == "config.json":
            out.mkdir()
            if content == "a file":
                (out / "notes.txt").write_text("mine")

    monkeypatch.setattr(writer, "write_json", someone_makes_the_folder)
    done = export_in_process(capsys, "--run", str(run_dir), "--out", str(out), *(["--overwrite"] if overwrite else []))
    if overwrite and content == "empty":
        assert done.returncode == 0 and (out / "model.safetensors").is_file()
    else:
        assert_one_line_error(done, str(out))
        assert [p.name for p in out.iterdir()] == (["notes.txt"] if content == "a file" else [])
    if content == "a file":
        assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
