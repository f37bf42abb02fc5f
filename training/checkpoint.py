"""The run directory: what it holds, refusing to clobber another run, and the trainer state.

The trainer state holds only tensors, dicts, lists and scalars, so it loads with
``torch.load(weights_only=True)``; numpy's and Python's RNG states are converted to such types.
"""

from __future__ import annotations

import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from common.errors import UserError
from common.files import atomic_output
from common.os_errors import with_path
from common.run_files import LOCK_FILES, RUN_FILES, STATE_FILE
from model import GPTConfig, save_pretrained

FORMAT_VERSION = 1

# The model keys that fix the shapes of the weights or what they compute, which neither a resume nor
# a run started from a parent (train.init_from) may change: weights trained under a softcap or
# QK-norm mean something else without it. dropout, norm_eps and zero_init (an init only) may.
# mlp comes before ffn_hidden, whose width it changes: a switched MLP kind is named as such.
SHAPE_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "mlp", "ffn_hidden",
              "tie_embeddings", "attention", "kv_latent_dim", "q_latent_dim", "qk_norm", "logit_softcap",
              "residual_scalars", "value_embeddings")


class CheckpointError(UserError):
    """A run directory or checkpoint that does not fit the request."""


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a ``run_dir`` that may not be used; an old run there is only cleared later, by
    ``clear_old_run``, once every input of the new run has been read and checked."""
    if resume:
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


def clear_old_run(run_dir: Path) -> None:
    """Remove the files of a run being replaced (--overwrite) and make sure ``run_dir`` exists."""
    # Only what a run writes is removed: out_dir could be pointed anywhere by mistake.
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    shutil.rmtree(run_dir / "wandb", ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)


def save_checkpoint(run_dir: Path, model: nn.Module, state: dict[str, Any]) -> None:
    """Write the model files (all ``generate.py`` needs), then the trainer state (all ``--resume``
    needs, the weights included): a kill between the two leaves the previous trainer state as a
    consistent resume point."""
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


def check_model_shape(saved: GPTConfig, current: GPTConfig, run_dir: Path) -> None:
    """Refuse to resume when the config would build a model of another shape."""
    for key in SHAPE_KEYS:
        attr = "ffn_dim" if key == "ffn_hidden" else key  # the width an unset ffn_hidden gives
        was, now = getattr(saved, attr), getattr(current, attr)
        if was != now:
            raise CheckpointError(
                f"cannot resume {run_dir}: model.{key} is {now!r} in the config but {was!r} in "
                f"the checkpoint; use the run's own config.yaml or start a new run"
            )


# ---------------------------------------------------------------------------------------------
# RNG states as weights_only-loadable values


def capture_rng_state() -> dict[str, Any]:
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {"version": int(version), "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    keys = np_state["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
