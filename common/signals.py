"""Ctrl-C and SIGTERM held back while something must not be cut in half.

A Python signal handler runs between two bytecodes of the main thread, wherever it is. Some steps
break if an exception arrives there: importing torch (a half-imported numpy cannot be imported
again, and some library code catches the interrupt and goes on), or the two renames that swap an
export into place. ``held_signals`` notes a signal that comes during such a step and raises it
again once the step is done, through whatever handler was in place before; ``quiet_while_starting``
turns one that comes while a command imports its libraries into a quiet exit. In training, a
``StopRequest`` takes Ctrl-C and SIGTERM as a request to stop after the current step, so a checkpoint
gets saved."""

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def quiet_while_starting() -> Iterator[None]:
    """While the block runs, Ctrl-C or SIGTERM exits with 128 + the signal and no traceback; each
    entry script imports its command inside it, first thing. ``SystemExit``, not ``KeyboardInterrupt``
    (see above). Some code swallows any exception (torch's C start-up imports numpy and carries on
    when that fails), so a signal that came is raised again when the block ends. This module imports
    only the standard library, so nothing slow comes before the block."""
    received: list[int] = []

    def exit_with_the_signal(signum: int, frame: object) -> None:
        received.append(signum)
        raise SystemExit(128 + signum)

    with _handlers_replaced_by(exit_with_the_signal):
        yield
    if received:
        raise SystemExit(128 + received[0])


@contextmanager
def held_signals() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM for the block; the first that came is raised when it ends.
    Blocking the signals at the OS level would not do: another thread (torch's, say) would take
    them, and Python would run the handler in the main thread all the same."""
    caught: list[int] = []
    try:
        with _handlers_replaced_by(lambda number, frame: caught.append(number)):
            yield
    finally:
        if caught:
            signal.raise_signal(caught[0])


@contextmanager
def _handlers_replaced_by(handler: Callable[[int, object], None]) -> Iterator[None]:
    """``handler`` for Ctrl-C and SIGTERM during the block, then the previous handlers again. A
    signal set to be ignored (Ctrl-C for a shell's background job) stays ignored. Outside the main
    thread Python runs no handler, so nothing is replaced."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    for signum, before in previous.items():
        if before is not signal.SIG_IGN:
            signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, signal.SIG_DFL if before is None else before)


class StopNow(Exception):
    """A signal arrived after the last checkpoint was saved; the work in progress is dropped."""


class StopRequest:
    """Records the first SIGINT/SIGTERM instead of dying, so the step finishes and is saved (as
    schedulers expect, sending SIGTERM before SIGKILL); a second Ctrl-C aborts at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        # Set once everything is saved (the final validation): a signal then ends that work at
        # once by raising StopNow, since nothing is left to save.
        self.raise_on_signal = False
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> None:
        # Python only lets the main thread set handlers; elsewhere signals keep their defaults.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.raise_on_signal:
            self.signum = signum
            raise StopNow(signum)
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            name = signal.Signals(signum).name
            sys.stderr.write(
                f"\n{name} received: finishing this step, saving a checkpoint, then exiting "
                f"(press Ctrl-C again to abort without saving)\n"
            )
            sys.stderr.flush()
        self.signum = signum
