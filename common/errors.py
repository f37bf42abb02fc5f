"""The errors command lines turn into a one-line message and exit code 2: something the user can fix
(a bad flag, a missing file, a config typo; ``DataError`` for a corpus, a source setting or the cache),
so the message names the problem and the fix. Filesystem failures the user can fix (full disk,
read-only mount, a file where a directory should be) become one such line: the path, the cause, the fix."""

import errno
import os


class UserError(Exception):
    """An error caused by the user's input; its message says what to change."""


class DataError(UserError):
    """A corpus, source setting or cache problem; the message names the problem and the fix."""


def one_line(error: BaseException, *, with_type: bool = False) -> str:
    """The first line of an exception's message, for one-line reports (its type name if empty)."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    return f"{type(error).__name__}: {lines[0]}" if with_type else lines[0]


_FIXES = {
    errno.ENOSPC: "the disk is full; free space on it or choose a directory on another disk",
    errno.EDQUOT: "the disk quota is exceeded; free space or choose a directory on another disk",
    errno.EROFS: "the filesystem is read-only; choose a writable directory",
    errno.EACCES: "permission denied; choose a directory you can write, or fix its permissions",
    errno.EPERM: "permission denied; choose a directory you can write, or fix its permissions",
    errno.ENOTDIR: "a part of the path is a file, not a directory; choose another directory",
    errno.EISDIR: "a directory is in the way of a file; move it aside",
    errno.ENAMETOOLONG: "the path is too long; choose a shorter one",
    errno.EIO: "the disk reported an I/O error; check the disk or choose another one",
    errno.EBADF: "the file is closed; check the redirection",
}


def describe_os_error(error: OSError, path: str | os.PathLike | None = None) -> str:
    where = error.filename or path or "a file"
    reason = error.strerror or one_line(error)  # without an errno, its message is all it says
    fix = _FIXES.get(error.errno or 0, "check the path and the disk")
    return f"{where}: {reason}; {fix}"


def with_path(error: OSError, path: str | os.PathLike) -> OSError:
    """``error`` naming ``path`` when it names no file (a failed ``os.write`` names none); one without
    an errno (a library's own, a lost connection) is not about a path, and is kept as it is."""
    if error.filename is not None or error.errno is None:
        return error
    return OSError(error.errno, error.strerror, os.fspath(path))
