"""What every command line shares: flag mistakes and user errors become one ``error: ...`` line.

``run_command`` is the one place that turns a ``UserError`` into that line on stderr and exit code 2;
anything else is a bug and keeps its traceback. Each command line adds only the failures that are
its own (a closed pipe for ``generate.py``, a full disk for ``train.py``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn, Sequence

from common.errors import UserError


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises a UserError instead of printing usage and exiting, so flag mistakes get
    the same one-line message as every other user error (and ``main`` can be called in-process)."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message}; see python {self.prog} --help")


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
        print(f"error: {error}", file=sys.stderr)
        return 2
