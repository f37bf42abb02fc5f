"""What every command line shares: flag mistakes and user errors become one ``error: ...`` line
(``run_command``); anything else is a bug and keeps its traceback. Each command line adds only the
failures that are its own (a closed pipe for ``generate.py``, a full disk for ``train.py``)."""

import _thread
import argparse
import math
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, NoReturn, Sequence

from common.errors import UserError, describe_os_error


def whole_number(text: str) -> int | None:
    """``text`` as a whole number written in ASCII digits, or None: ``int`` also takes other
    scripts' digits and underscores, but ``str.isdigit`` admits superscripts that ``int`` refuses."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse ``type`` for a count that may be zero (to skip a step): a whole number >= 0."""
    value = whole_number(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type`` for a size or a duration: a finite number > 0 (nan compares as nothing,
    so it would pass every later check)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def path_arg(text: str) -> Path:
    """An argparse ``type`` for a file or folder: ``Path("")`` is ``.``, so an empty value (an unset
    shell variable) would otherwise name the current folder, which the user never gave."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a path, got {text!r}")
    return Path(text)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises a UserError instead of printing usage and exiting, so flag mistakes get
    the same one-line message as every other user error (and ``main`` can be called in-process)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog if self.prog.startswith("python ") else f"python {self.prog}"  # a module: python -m
        raise UserError(f"{message}; see {command} --help")


def run_command(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    command: Callable[[argparse.Namespace], int],
) -> int:
    """Parse ``argv`` and run ``command`` on the flags; returns the exit code (2 for a user error)."""
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # --help (or a plain argparse parser refusing a flag)
            return int(done.code or 0)
        return command(args)
    except UserError as error:
        # One write: unbuffered stderr would write print's newline apart, and the lines of
        # processes sharing it (torchrun's ranks) would run together.
        sys.stderr.write(f"error: {error}\n")
        return 2


class Terminated(BaseException):
    """SIGTERM, raised where the command is, so that its clean-up runs as it does for Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextmanager
def terminated_raises() -> Iterator[None]:
    """SIGTERM raised as ``Terminated`` in the main thread for the block (a tool's worker process it started)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return

    def raise_terminated(signum: int, frame: object) -> None:
        raise Terminated(signum)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_stoppable(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    command: Callable[[argparse.Namespace], int],
) -> int:
    """``run_command`` for a command that writes files: a filesystem failure (full disk, read-only
    folder) is one line and exit 2, and Ctrl-C exits with 130 and SIGTERM with 143, with no
    traceback, once the command's own clean-up (its ``finally`` blocks) has run. Call it before
    importing torch, so that a signal during those imports is handled too. Library code that catches
    the signal's exception and carries on would run the command to its end, so it is raised again
    every few seconds (``_StopRequest``), and a command that finishes anyway exits with its code."""
    stop = _StopRequest()
    # A signal set to be ignored (Ctrl-C for a shell's background job) stays ignored.
    previous = {signum: signal.signal(signum, stop.handle) for signum in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        code = run_command(parser, argv, command)
        return 128 + stop.signum if stop.signum else code
    except OSError as error:
        print(f"error: {describe_os_error(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)  # put the shell prompt back on a line of its own
        return 128 + signal.SIGINT
    except Terminated as stopped:
        return 128 + stopped.signum
    finally:
        stop.done.set()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class _StopRequest:
    """The first SIGINT or SIGTERM, raised as an exception and raised again until it is obeyed."""

    AGAIN_AFTER_S = 5.0  # long enough for clean-up in ``finally`` blocks to finish undisturbed

    def __init__(self) -> None:
        self.signum = 0
        self.done = threading.Event()

    def handle(self, signum: int, frame: object) -> None:
        if not self.signum:
            self.signum = signum
            threading.Thread(target=self._repeat, daemon=True).start()
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(self.signum)

    def _repeat(self) -> None:
        while not self.done.wait(self.AGAIN_AFTER_S):
            _thread.interrupt_main(self.signum)
