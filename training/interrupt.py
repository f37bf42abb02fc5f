"""Ctrl-C and SIGTERM as a request to stop after the current step, so a checkpoint gets saved."""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any


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
