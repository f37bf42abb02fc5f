"""One training per run directory: an OS-level lock (``filelock``) held by the writing process for
the whole run. The kernel drops it when the process exits, kill -9 included, so a crashed run
never leaves a stale lock behind. The holder's pid and host go to a sidecar file, so a refused
second training can say who holds the directory. Readers never take the lock. Holding it makes
it safe to delete the temporary files that killed atomic writes left: nobody else writes them."""

import contextlib
import os
import socket
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from common.errors import UserError, describe_os_error
from rundir.files import LOCK_FILE, LOCK_OWNER_FILE


class RunDirectoryBusy(UserError):
    """Another process is training in this run directory."""


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Create ``run_dir`` if needed and hold its lock for the duration of the block."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run.out_dir {run_dir} is a file, not a directory; choose another run.out_dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(describe_os_error(e, run_dir)) from None
    lock = FileLock(str(run_dir / LOCK_FILE), timeout=0, mode=0o644)
    try:
        lock.acquire()
    except Timeout:
        raise RunDirectoryBusy(
            f"{run_dir} is in use by another training ({_read_owner(run_dir)}); wait for it to "
            f"finish or stop it, or set run.out_dir to another directory"
        ) from None
    except OSError as e:
        raise UserError(describe_os_error(e, run_dir)) from None
    try:
        try:
            (run_dir / LOCK_OWNER_FILE).write_text(f"pid {os.getpid()} on host {socket.gethostname()}\n")
        except OSError as e:
            raise UserError(describe_os_error(e, run_dir / LOCK_OWNER_FILE)) from None
        remove_leftover_temps(run_dir)
        yield
    finally:
        lock.release()


def remove_leftover_temps(run_dir: Path) -> None:
    """Delete ``.<name>.*.tmp`` files left by atomic writes that were killed."""
    for path in run_dir.glob(".*.tmp"):
        if path.is_file():
            path.unlink(missing_ok=True)


def _read_owner(run_dir: Path) -> str:
    try:
        owner = (run_dir / LOCK_OWNER_FILE).read_text().strip()
    except OSError:
        owner = ""
    return owner or "holder unknown"
