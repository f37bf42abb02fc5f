"""Filesystem failures as one line (common/errors.py): the path, the cause, the fix."""

import errno
import os

from common.errors import describe_os_error, with_path


def test_an_error_names_the_path_its_cause_and_the_fix_or_keeps_its_own_words():
    full = with_path(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "data_cache/x")  # os.write names no file
    assert describe_os_error(full) == ("data_cache/x: No space left on device; the disk is full; free space on it "
                                       "or choose a directory on another disk")
    # A library's short write once read "a file: OSError", losing the only words that said what failed.
    short = OSError("1574407 requested and 126976 written")
    assert with_path(short, "data_cache/x") is short  # no errno: not known to be about that path
    assert describe_os_error(short, "data_cache/x") == (
        "data_cache/x: 1574407 requested and 126976 written; check the path and the disk")
    assert describe_os_error(OSError()) == "a file: OSError; check the path and the disk"
