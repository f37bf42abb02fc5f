"""The hidden folders an export is built in beside ``--out``: their names, the swap into place, and
the clean-up after an export that was killed.

An export writes ``.<out>.<pid>-<random>.tmp`` and, when it replaces an earlier export, moves that
one aside to ``.<out>.<pid>-<random>.old`` for the moment of the swap. Both sit beside ``--out`` so
that each rename stays on one filesystem (and so is atomic). A SIGKILL, or a machine that stops,
leaves them behind; the next export to the same parent removes those whose process is gone, and
puts back an ``.old`` folder whose export never arrived, since it is the last complete one.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.files import process_alive

_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)-[0-9a-f]{12}\.(?P<kind>tmp|old)$")


@contextmanager
def staged_export(out_dir: Path) -> Iterator[Path]:
    """A new hidden folder beside ``out_dir`` to write an export into (both formats use it); when
    the block ends it is swapped into place, and if the block fails it is removed. A filesystem
    failure names ``out_dir``, the folder the user asked for, not the hidden one."""
    staging = sibling(out_dir, "tmp")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()  # not mkdtemp: its owner-only mode would stay on the finished folder
        yield staging
        replace_dir(staging, out_dir)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError) and error.errno is not None:
            raise OSError(error.errno, error.strerror, str(out_dir)) from None
        raise


def sibling(out_dir: Path, kind: str) -> Path:
    """A hidden name beside ``out_dir`` that no other export uses, naming this process."""
    return out_dir.parent / f".{out_dir.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.{kind}"


def replace_dir(staging: Path, out_dir: Path) -> None:
    """Move the finished ``staging`` folder to ``out_dir``, which keeps its old contents until then."""
    if not out_dir.exists():
        staging.rename(out_dir)
        return
    old = sibling(out_dir, "old")
    out_dir.rename(old)
    try:
        staging.rename(out_dir)
    except BaseException:
        old.rename(out_dir)  # put the previous export back
        raise
    shutil.rmtree(old, ignore_errors=True)


def clean_leftovers(parent: Path) -> None:
    """Remove what killed exports left in ``parent``; an export still running keeps its folders.

    Whether the writer still runs is judged by its process id on this machine: on a filesystem
    that several machines share, run concurrent exports in different parents."""
    if not parent.is_dir():
        return
    for path in parent.iterdir():
        found = _LEFTOVER.match(path.name)
        if found is None or not path.is_dir() or process_alive(int(found["pid"])):
            continue
        target = parent / found["name"]
        if found["kind"] == "old" and not target.exists():
            path.rename(target)  # killed between the two renames of replace_dir
        else:
            shutil.rmtree(path, ignore_errors=True)
