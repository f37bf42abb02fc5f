"""The one exception type that command lines turn into a one-line message and exit code 2: something
the user can fix (a bad flag, a missing file, a config typo), so its message names the problem and the fix."""


class UserError(Exception):
    """An error caused by the user's input; its message says what to change."""


def one_line(error: BaseException, *, with_type: bool = False) -> str:
    """The first line of an exception's message, for one-line reports (its type name if empty)."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    return f"{type(error).__name__}: {lines[0]}" if with_type else lines[0]
