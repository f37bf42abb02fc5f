"""Ctrl-C and SIGTERM held back while something must not be cut in half.

A Python signal handler runs between two bytecodes of the main thread, wherever it is. Some steps
break if an exception arrives there: importing torch (a half-imported numpy cannot be imported
again, and some library code catches the interrupt and goes on), or the two renames that swap an
export into place. ``held_signals`` notes a signal that comes during such a step and raises it
again once the step is done, through whatever handler was in place before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def quiet_while_starting() -> None:
    """Until a command's own handlers take over (``common.cli.run_stoppable``), Ctrl-C or SIGTERM
    during its imports exits with 128 + the signal and no traceback. A command's script calls this
    first: on a busy machine the imports before ``main`` can take a noticeable fraction of a
    second. A signal set to be ignored (Ctrl-C for a shell's background job) stays ignored."""
    for signum in _SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _exit_with_the_signal)


def _exit_with_the_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def held_signals() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM for the block; the first that came is raised when it ends.

    Blocking the signals at the OS level would not do: another thread (torch's, say) would take
    them, and Python would run the handler in the main thread all the same. Outside the main
    thread Python runs no handler, so there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, lambda number, frame: caught.append(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])
