"""common.cli: run_stoppable, where a signal ends the command with 130 or 143 after its clean-up, swallowed
or not; and path_arg, where an empty path flag (an unset shell variable: ``--out "$OUT"``) is refused by
name: ``Path("")`` is the current folder, which the user never gave, and messages would otherwise talk
about ``.``."""

import argparse
import errno
import importlib
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from common.cli import ArgumentParser, path_arg
from common.errors import UserError
from signal_testkit import start_paused, stop


def _start(tmp_path: Path, body: str) -> subprocess.Popen:
    """A command run by run_stoppable whose ``work(args)`` is ``body``; it touches ``ready`` when
    it waits for the signal and ``cleaned`` in its ``finally``."""
    script = textwrap.dedent('''
        import pathlib, sys, time
        import common.cli as cli
        from common.cli import ArgumentParser, run_stoppable

        cli._StopRequest.AGAIN_AFTER_S = 0.5
        ready, cleaned = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])

        def wait():
            ready.touch()
            for _ in range(600):
                time.sleep(0.05)

        def command(args):
            try:
        {body}
            finally:
                cleaned.touch()

        sys.exit(run_stoppable(ArgumentParser(prog="test"), [], command))
    ''').replace("{body}", textwrap.indent(textwrap.dedent(body), " " * 8))
    return start_paused(["-c", script, str(tmp_path / "ready"), str(tmp_path / "cleaned")], tmp_path / "ready")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_signal_exits_with_its_code_after_the_clean_up(tmp_path, signum, code):
    process = _start(tmp_path, "wait()\nreturn 0")
    assert stop(process, signum) == (code, "\n" if signum == signal.SIGINT else "")
    assert (tmp_path / "cleaned").exists()


SWALLOWED = "try:\n    wait()\nexcept BaseException:\n    pass  # a library callback that swallows the interrupt\n"


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("then", ["works on", "finishes"])
def test_a_signal_that_a_callback_swallows_is_raised_again(tmp_path, signum, code, then):
    tail = "for _ in range(600):\n    time.sleep(0.05)\nreturn 0" if then == "works on" else "return 0"
    process = _start(tmp_path, SWALLOWED + tail)
    started = time.monotonic()
    returncode, err = stop(process, signum)
    assert returncode == code and "Traceback" not in err, err
    assert time.monotonic() - started < 20 and (tmp_path / "cleaned").exists()


def _starting(tmp_path: Path, quiet: bool) -> subprocess.Popen:
    """A command script paused inside its imports, before run_stoppable installs any handler."""
    script = textwrap.dedent(f'''
        import contextlib, pathlib, sys, time
        from common.signals import quiet_while_starting
        with quiet_while_starting() if {quiet} else contextlib.nullcontext():
            pathlib.Path(sys.argv[1]).touch()
            for _ in range(600):  # the imports of a busy machine's start
                time.sleep(0.05)
    ''')
    return start_paused(["-c", script, str(tmp_path / "importing")], tmp_path / "importing")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_a_signal_during_a_commands_imports_exits_quietly_with_its_code(tmp_path, signum, code):
    assert stop(_starting(tmp_path, quiet=True), signum) == (code, "")
    if signum == signal.SIGINT:  # without quiet_while_starting, a traceback
        (tmp_path / "unguarded").mkdir()
        returncode, err = stop(_starting(tmp_path / "unguarded", quiet=False), signum)
        assert returncode == -signal.SIGINT and "KeyboardInterrupt" in err


def test_after_the_imports_the_previous_handlers_are_back(capsys):
    """The command's own handling of Ctrl-C (a chat reply stopped, not the chat) starts after it."""
    from common.signals import quiet_while_starting

    # Known handlers first: a suite started in the background inherits Ctrl-C ignored, which the
    # block rightly leaves alone.
    outer = {signum: signal.signal(signum, signal.default_int_handler) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        before = {signum: signal.getsignal(signum) for signum in outer}
        with quiet_while_starting():
            assert all(signal.getsignal(signum) is not handler for signum, handler in before.items())
        assert {signum: signal.getsignal(signum) for signum in before} == before
    finally:
        for signum, handler in outer.items():
            signal.signal(signum, handler)
    # A filesystem failure is one line.
    from common.cli import ArgumentParser, run_stoppable

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "out/model.onnx")

    assert run_stoppable(ArgumentParser(prog="test"), [], full) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: out/model.onnx: No space left on device; the disk is full") and err.count("\n") == 1


def test_a_signal_that_an_import_swallows_still_ends_the_start():
    """torch's C start-up imports numpy and carries on whatever that raises: the exit comes again
    when the imports are done."""
    from common.signals import quiet_while_starting

    with pytest.raises(SystemExit) as stopped:
        with quiet_while_starting():
            try:
                signal.raise_signal(signal.SIGTERM)
            except BaseException:  # what a library's catch-all does
                pass
    assert stopped.value.code == 128 + signal.SIGTERM


# Empty paths

# Every command line that takes a path, with a flag of each and the other flags it requires.
PARSERS = {
    "exporting.cli": (["--run", "runs/x", "--out", "exports/x"], ["--run", "--out"]),
    "inference.cli": (["--run", "runs/x", "--prompt", "hi"], ["--run", "--prompt-file"]),
    "serving.cli": (["--run", "runs/x"], ["--run"]),
    "evaluation.cli": (["--run", "runs/x"], ["--run"]),
    "analysis.cli": (["--run", "runs/x", "--prompt", "hi"], ["--run", "--out"]),
    "analysis.cli roles": (["--run", "runs/x", "--roles"], ["--run", "--text-file"]),
    "benchmarks.induction_lab": ([], ["--out"]),
}


@pytest.mark.parametrize("text", ["", "   "])
def test_path_arg_refuses_an_empty_value(text):
    parser = ArgumentParser(prog="tool.py")
    parser.add_argument("--out", type=path_arg)
    with pytest.raises(UserError, match=r"^argument --out: must be a path, got '\s*'; see python tool.py --help$"):
        parser.parse_args(["--out", text])


def test_path_arg_keeps_a_real_path():
    assert str(path_arg("runs/tiny")) == "runs/tiny"
    assert str(path_arg(" odd name ")) == " odd name "  # a path may hold spaces; only blank is refused


@pytest.mark.parametrize("module", sorted(PARSERS))
def test_every_command_line_refuses_an_empty_path(module):
    parser: argparse.ArgumentParser = importlib.import_module(module.split()[0]).build_parser()
    base, flags = PARSERS[module]
    parser.parse_args(base)  # the base arguments alone are accepted
    for flag in flags:
        argv = [*base, flag, ""]
        with pytest.raises(UserError, match=f"argument {flag}: must be a path, got ''"):
            parser.parse_args(argv)
