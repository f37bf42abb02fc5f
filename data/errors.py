"""The error every data problem the user can fix is reported as."""

from __future__ import annotations

from common.errors import UserError


class DataError(UserError):
    """A corpus, source setting or cache problem; the message names the problem and the fix."""
