"""The export folder's life: where it may go, the hidden folder it is built in, how it is
published at ``--out``, what ``--overwrite`` may remove, and the clean-up after a killed export.

An export writes ``.<out>.<pid>-<random>.tmp`` beside ``--out`` (and moves an export it replaces
aside to ``.old`` for the swap), so that each rename stays on one filesystem. Publishing checks
the destination again, since an export can take minutes, and exports of one ``--out`` publish one
at a time under a lock, so two that start together cannot both report success. ``--overwrite``
removes only an earlier export holding nothing but files an export writes. A SIGKILL leaves the
hidden folders behind; the next export to the same parent removes those whose process is gone,
and puts back an ``.old`` folder whose replacement never arrived."""

import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from common.errors import UserError
from common.files import process_alive
from common.signals import held_signals
from exporting.hub_files import LLAMA_MODEL_TYPE, MODEL_TYPE

GGUF_FILE = "model.gguf"  # the GGUF format's one file (exporting.gguf)
GGUF_MAGIC = b"GGUF"

# Every name an export of any format writes: the only entries --overwrite will delete.
EXPORT_FILES = frozenset({
    "config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json", "README.md",
    "model.safetensors", "configuration_minigpt.py", "modeling_minigpt.py", "model.onnx", GGUF_FILE,
})

_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)-[0-9a-f]{12}\.(?P<kind>tmp|old)$")


def prepare_destination(run_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Clean up after killed exports beside ``out_dir``, then refuse, in one line, an ``out_dir``
    that an export must not write to; it is checked again when the export is published."""
    clean_leftovers(out_dir.parent)  # first: it may put back the export a killed one was replacing
    check_destination(run_dir, out_dir, overwrite)


def check_destination(run_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Refuse, in one line, an ``out_dir`` that an export (of any format) must not write to."""
    blocking = next((parent for parent in out_dir.absolute().parents if parent.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise UserError(f"--out {out_dir} is inside {blocking}, which is a file; choose a folder elsewhere")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; choose a new folder for the export")
    if run_dir.resolve() == out_dir.resolve() or out_dir.resolve() in run_dir.resolve().parents:
        raise UserError(f"--out {out_dir} holds the run being exported; choose a folder outside it")
    if not overwrite:
        raise UserError(f"--out {out_dir} already exists; pass --overwrite to replace it, or choose a new folder")
    _check_replaceable(out_dir)


def _check_replaceable(directory: Path, shown: Path | None = None) -> None:
    """Refuse a folder that ``--overwrite`` must not delete: one that is not an export, or holds
    anything an export does not write. ``shown`` names it when it has been moved aside."""
    shown = shown or directory
    entries = sorted(path.name for path in directory.iterdir())
    if entries and not is_export(directory):
        raise UserError(f"--out {shown} is not empty and is not an earlier export, so --overwrite will not "
                        "delete it; choose a new folder")
    foreign = [name for name in entries if name not in EXPORT_FILES or not (directory / name).is_file()]
    if foreign:
        raise UserError(f"--out {shown} holds {foreign[0]!r}, which no export writes, so --overwrite will not "
                        "delete it; move it out of the folder, or choose a new folder")


def is_export(directory: Path) -> bool:
    """Whether ``directory`` holds a folder written by an export (of any format): a config of our
    model or of the Llama one, or, for GGUF, its one file."""
    if not (directory / "config.json").exists():
        try:
            with (directory / GGUF_FILE).open("rb") as gguf:
                return gguf.read(len(GGUF_MAGIC)) == GGUF_MAGIC
        except OSError:
            return False
    try:
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        return config.get("model_type") in (MODEL_TYPE, LLAMA_MODEL_TYPE)
    except (OSError, ValueError, AttributeError):
        return False


@contextmanager
def staged_export(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """A new hidden folder beside ``out_dir`` to write an export into, published at ``out_dir``
    when the block ends, removed if it fails. A filesystem failure names ``out_dir``."""
    staging = sibling(out_dir, "tmp")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()  # not mkdtemp: its owner-only mode would stay on the finished folder
        yield staging
        publish(staging, out_dir, overwrite)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError) and error.errno is not None:
            raise OSError(error.errno, error.strerror, str(out_dir)) from None
        raise


def sibling(out_dir: Path, kind: str) -> Path:
    """A hidden name beside ``out_dir`` that no other export uses, naming this process."""
    return out_dir.parent / f".{out_dir.name}.{os.getpid()}-{uuid.uuid4().hex[:12]}.{kind}"


def publish(staging: Path, out_dir: Path, overwrite: bool) -> None:
    """Move the finished ``staging`` folder to ``out_dir``: into a place nothing holds, or, with
    ``overwrite``, over an earlier export, which is removed once the new one is in place. Signals
    wait, so a Ctrl-C cannot land between the two renames."""
    with _publish_lock(out_dir), held_signals():
        if not out_dir.exists():
            _claim_and_move(staging, out_dir)
            return
        if not overwrite:
            raise UserError(f"--out {out_dir} appeared while the export ran (another export or program made it) "
                            "and is left as it is; pass --overwrite to replace it, or choose a new folder")
        _check_replaceable(out_dir)
        old = sibling(out_dir, "old")
        out_dir.rename(old)
        try:
            _check_replaceable(old, shown=out_dir)  # in case a file went in between the check and the move
            staging.rename(out_dir)
        except BaseException:
            old.rename(out_dir)  # put the previous export back
            raise
        remove_export(old)


def _claim_and_move(staging: Path, out_dir: Path) -> None:
    """Publish into a place nothing holds: ``mkdir`` fails if a folder appeared there, where
    ``rename`` would silently replace an empty one."""
    try:
        out_dir.mkdir()
    except FileExistsError:
        raise UserError(f"--out {out_dir} appeared while the export ran and is left as it is; "
                        "choose a new folder, or pass --overwrite to replace an earlier export") from None
    try:
        staging.rename(out_dir)
    except BaseException:
        try:
            out_dir.rmdir()  # only while it is still the empty claim
        except OSError:
            raise UserError(f"--out {out_dir} was written to while the export was being published, and is left "
                            "as it is; choose a new folder") from None
        raise


def remove_export(directory: Path) -> None:
    """Delete an export's own files and then its folder; anything else in it stays, with the folder."""
    for name in EXPORT_FILES:
        (directory / name).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        pass  # something else went in; it was not the export's to delete


@contextmanager
def _publish_lock(out_dir: Path) -> Iterator[None]:
    """Exports of one ``--out`` publish one at a time. The lock file is removed after use (filelock
    takes a fresh one under a waiting process)."""
    path = out_dir.parent / f".{out_dir.name}.lock"
    try:
        with FileLock(path):
            yield
    finally:
        path.unlink(missing_ok=True)


@contextmanager
def scratch_folder(parent: Path, name: str) -> Iterator[Path]:
    """A new hidden folder in ``parent`` for a temporary export (evaluation's), removed when the
    block ends; one whose process was killed is removed by the next call."""
    clean_leftovers(parent)
    folder = sibling(parent / name, "tmp")
    folder.mkdir()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def clean_leftovers(parent: Path) -> None:
    """Remove what killed exports left in ``parent``, judged by process id on this machine (on a
    filesystem several machines share, run concurrent exports in different parents)."""
    if not parent.is_dir():
        return
    for path in parent.iterdir():
        found = _LEFTOVER.match(path.name)
        if found is None or not path.is_dir() or process_alive(int(found["pid"])):
            continue
        target = parent / found["name"]
        if found["kind"] == "old" and not target.exists():
            path.rename(target)  # killed between the two renames of publish
        else:
            shutil.rmtree(path, ignore_errors=True)
