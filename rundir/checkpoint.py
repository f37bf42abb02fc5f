"""The run directory's checkpoint: refusing to clobber another run, and writing and reading the
trainer state beside the saved model.

The trainer state holds only tensors, dicts, lists and scalars (training converts its RNG states
to such types), so it loads with ``torch.load(weights_only=True)``, which unpickles no code."""

import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.errors import UserError, with_path
from common.files import atomic_output
from model.io import save_pretrained
from rundir.files import LOCK_FILES, METRICS_FILE, RUN_FILES, SHARDED_PREFIX, STATE_FILE
from rundir.metrics import read_metrics

FORMAT_VERSION = 1


class CheckpointError(UserError):
    """A run directory or checkpoint that does not fit the request."""


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a ``run_dir`` that may not be used; an old run there is only cleared later, by
    ``clear_old_run``, once every input of the new run has been read and checked."""
    if resume:
        if (run_dir / STATE_FILE).exists() and not (run_dir / STATE_FILE).is_file():
            raise CheckpointError(f"cannot resume: {run_dir / STATE_FILE} is not a file (a folder?); it must be "
                                  f"the checkpoint train.py wrote: restore it, or start a new run without --resume")
        if not (run_dir / STATE_FILE).is_file():
            raise CheckpointError(
                f"cannot resume: no checkpoint ({STATE_FILE}) in {run_dir}; "
                f"start a new run without --resume or point run.out_dir at an existing run"
            )
        return
    if run_dir.exists() and not run_dir.is_dir():
        raise CheckpointError(f"run.out_dir {run_dir} is a file, not a directory; choose another run.out_dir")
    if run_dir.is_dir() and any(p.name not in LOCK_FILES for p in run_dir.iterdir()) and not overwrite:
        if any((run_dir / name).exists() for name in RUN_FILES):
            raise CheckpointError(
                f"{run_dir} already holds a run; pass --resume to continue it, --overwrite to "
                f"replace it, or set run.out_dir to a new directory"
            )
        raise CheckpointError(
            f"{run_dir} is not empty and holds no run; set run.out_dir to an empty or new "
            f"directory, or pass --overwrite to train there anyway"
        )


def run_progress(run_dir: Path) -> str:
    """How far the run in ``run_dir`` got: ``new``, ``finished`` (it had its final validation) or
    ``stopped`` (a checkpoint to resume from)."""
    if not run_dir.is_dir() or not any((run_dir / name).exists() for name in RUN_FILES):
        return "new"
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and any(r.get("kind") == "final_eval" for r in read_metrics(metrics)):
        return "finished"
    return "stopped" if (run_dir / STATE_FILE).is_file() else "new"


def clear_old_run(run_dir: Path) -> None:
    """Remove the files of a run being replaced (--overwrite) and make sure ``run_dir`` exists."""
    # Only what a run writes is removed: out_dir could be pointed anywhere by mistake.
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "wandb", ignore_errors=True)
    for folder in run_dir.glob(SHARDED_PREFIX + "*"):
        shutil.rmtree(folder, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)


def save_checkpoint(run_dir: Path, model: nn.Module | None, state: dict[str, Any]) -> None:
    """Write the model files (all ``generate.py`` needs; None: leave those there, the weights a run
    keeps), then the trainer state (all ``--resume`` needs, the weights included): a kill between
    the two leaves the previous trainer state as a consistent resume point."""
    if model is not None:
        save_pretrained(model, run_dir)
    payload = {"format_version": FORMAT_VERSION, **state}
    with atomic_output(run_dir / STATE_FILE) as tmp:
        # Through a Python file object, a full disk surfaces as OSError(ENOSPC); given a path,
        # torch's own writer reports it as an opaque RuntimeError. Even so, closing the zip
        # after the failed write raises a RuntimeError over it: report the OSError underneath.
        # The disk may also fill only when the file's last buffer is flushed on close.
        try:
            with open(tmp, "wb") as f:
                torch.save(payload, f)
        except OSError as e:
            raise with_path(e, run_dir / STATE_FILE) from None
        except RuntimeError as e:
            if isinstance(e.__context__, OSError):
                raise with_path(e.__context__, run_dir / STATE_FILE) from None
            raise


def load_trainer_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"cannot resume: no checkpoint ({STATE_FILE}) in {run_dir}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # Never quote torch's message here: it suggests retrying with weights_only=False, which
        # would run whatever code the file carries.
        if "Unsupported global" not in str(e):
            raise CheckpointError(
                f"checkpoint {path} cannot be read (not a file torch.save wrote, or damaged); "
                f"start a new run with --overwrite"
            ) from None
        raise CheckpointError(
            f"checkpoint {path} holds Python objects other than tensors and plain values, so "
            f"train.py did not write it (or it was altered) and it is not loaded; restore the run's "
            f"own trainer_state.pt or start a new run with --overwrite"
        ) from None
    except Exception as e:  # noqa: BLE001 - any failure to unpickle means the file is unusable
        # The error's first line, without the lines of torch's advice to pass weights_only=False.
        lines = [line for line in str(e).splitlines() if line.strip() and "weights_only" not in line]
        reason = lines[0] if lines else type(e).__name__
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({reason}); start a new run with --overwrite"
        ) from None
    if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has an unknown format; start a new run with --overwrite")
    return state


def peek_trainer_state(run_dir: Path, key: str) -> Any:
    """One value of the run's trainer state, or None when there is none this torch can read;
    memory-mapped, so the optimizer state is never read into memory."""
    try:
        state: Any = torch.load(run_dir / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - missing, damaged or from another torch: nothing to peek at
        return None
    return state.get(key) if isinstance(state, dict) else None
