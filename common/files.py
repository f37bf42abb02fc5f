"""Atomic file writes: a reader sees the old file or the new one, never half of either.

Each write goes to a temporary file in the same directory, is flushed and fsync'ed, and is then
renamed over the target. ``os.replace`` is atomic on POSIX and Windows when both paths are on the
same filesystem, which holds because the temporary file sits beside the target."""

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path to write (for writers that want a filename: safetensors, torch.save);
    on success it replaces ``path``, on error it is removed. ``suffix`` ends the temporary name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    # mkstemp creates the file owner-only (0600); give it the mode a plain open() would have.
    # The only portable way to read the umask is to set it and put it back.
    umask = os.umask(0o022)
    os.umask(umask)
    mode = 0o666 & ~umask
    os.fchmod(fd, mode)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # Some writers (safetensors) replace the file rather than write into it, and create the
        # replacement owner-only; set the mode again on whatever is there now.
        os.chmod(tmp, mode)
        _fsync_file(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    # Makes the rename itself durable; not every platform lets a directory be opened or synced.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine, so that what it is writing (a temporary
    file or folder) must be left alone; one of another user counts as running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OverflowError:  # not a pid this system could have
        return False
    return True
