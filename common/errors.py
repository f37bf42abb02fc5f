"""The one exception type that command lines turn into a one-line message and exit code 2.

Anything raised as a ``UserError`` is something the user can fix (a bad flag, a missing file, a
config typo), so its message must name the problem and the fix in one line. Every other exception
is a bug and keeps its traceback.
"""


class UserError(Exception):
    """An error caused by the user's input; its message says what to change."""
