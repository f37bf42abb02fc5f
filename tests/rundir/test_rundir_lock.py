"""The run-directory lock: one holder at a time, named to the one refused. (Taking it clears the leftovers of
atomic writes, and only those: test_train_cli.py's resume.)"""

import os

import pytest

from common.errors import UserError
from rundir.files import LOCK_FILES, LOCK_OWNER_FILE
from rundir.lock import RunDirectoryBusy, hold_run_dir


def test_the_lock_refuses_a_second_holder_or_a_file(tmp_path):
    run_dir = tmp_path / "new" / "run"
    with hold_run_dir(run_dir):  # creates the directory
        assert sorted(p.name for p in run_dir.iterdir()) == sorted(LOCK_FILES)
        with pytest.raises(RunDirectoryBusy, match=f"pid {os.getpid()} on host"):
            with hold_run_dir(run_dir):
                pass
    with hold_run_dir(run_dir):  # released when the first block ended
        assert f"pid {os.getpid()}" in (run_dir / LOCK_OWNER_FILE).read_text()
    # A file in place of the directory is refused.
    (tmp_path / "run").write_text("not a directory")
    with pytest.raises(UserError, match="is a file, not a directory"):
        with hold_run_dir(tmp_path / "run"):
            pass
