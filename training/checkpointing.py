"""The run's checkpoint, whatever the run is (one process, ddp or fsdp), behind one interface.

Every checkpoint is the run directory's whole model (``model.safetensors``, all ``generate.py``
needs) and its trainer state (``trainer_state.pt``: step, clocks, every rank's sampler and RNG
streams). Where the weights and optimizer state for ``--resume`` go depends on how the model is held:

- whole (one process, ddp): inside the trainer state, written by rank 0;
- sharded (``train.parallel: fsdp``, at any number of processes): a ``torch.distributed.checkpoint``
  folder that every rank writes in parallel and a later run reshards to its own world size. It is
  written as ``<name>.partial`` and published by rename; the trainer state names the published
  folder, so a crash before that state is replaced leaves the previous checkpoint whole.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from common.errors import one_line
from common.os_errors import describe_os_error, with_path
from model import GPT, GPTConfig
from rundir.checkpoint import CheckpointError, save_checkpoint
from rundir.files import SHARDED_PREFIX
from training.distributed import DistContext, barrier, decided_on_main
from training.fsdp import full_model_on_main, is_sharded
from training.optim import load_optimizer_state
from training.resume_rules import check_optimizer_groups

_PARTIAL = ".partial"  # a folder being written; never read


@dataclass(frozen=True)
class Checkpointer:
    """Saves and restores a run's model and optimizer with its trainer state; every rank calls each
    method. This one keeps them whole in the trainer state."""

    run_dir: Path
    ctx: DistContext
    model_config: GPTConfig
    device: torch.device

    def whole_model(self, model: GPT) -> GPT | None:
        """The model whole on rank 0 (None on the others), e.g. to decode samples from."""
        return model

    def save(self, step: int, model: GPT, optimizer: Any, state: dict[str, Any]) -> None:
        """Write the checkpoint of ``step``; ``state`` is the trainer state (rank 0's is kept)."""
        whole = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        decided_on_main(self.ctx, lambda: save_checkpoint(self.run_dir, model, {**state, **whole}))

    def restore(self, state: dict[str, Any], model: GPT, optimizer: Any) -> None:
        """Load a saved trainer state's model and optimizer state."""
        model.load_state_dict(state["model"])
        check_optimizer_groups(state["optimizer"], optimizer.state_dict(), self.run_dir)
        load_optimizer_state(optimizer, state["optimizer"])


class ShardedCheckpointer(Checkpointer):
    """``train.parallel: fsdp``: the weights and optimizer state in a sharded folder that the trainer
    state names, and ``model.safetensors`` gathered whole, as in any run."""

    def whole_model(self, model: GPT) -> GPT | None:
        if not is_sharded(model):  # fsdp in a single process holds the model whole
            return model
        return full_model_on_main(model, self.model_config, self.ctx.is_main, self.device)

    def save(self, step: int, model: GPT, optimizer: Any, state: dict[str, Any]) -> None:
        name = save_sharded(self.run_dir, step, model, optimizer, self.ctx)
        plain = self.whole_model(model)

        def publish() -> None:
            save_checkpoint(self.run_dir, plain, {**state, "sharded": name})
            remove_stale_checkpoints(self.run_dir, keep=name)

        decided_on_main(self.ctx, publish)

    def restore(self, state: dict[str, Any], model: GPT, optimizer: Any) -> None:
        load_sharded(self.run_dir, state["sharded"], model, optimizer)


def checkpointer_for(parallel: str, run_dir: Path, ctx: DistContext, model_config: GPTConfig,
                     device: torch.device) -> Checkpointer:
    """The checkpoint of a run trained with ``train.parallel`` set to ``parallel``."""
    kind = ShardedCheckpointer if parallel == "fsdp" else Checkpointer
    return kind(run_dir, ctx, model_config, device)


def _optimizer_parts(optimizer: Any) -> dict[str, torch.optim.Optimizer]:
    """The torch optimizers inside the trainer's optimizer (Muon + AdamW is two)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return {"optimizer": optimizer}
    return {"muon": optimizer.muon, "adamw": optimizer.adamw}


def save_sharded(run_dir: Path, step: int, model: nn.Module, optimizer: Any, ctx: DistContext) -> str:
    """Write the weights and optimizer state of ``step`` with torch.distributed.checkpoint into a
    new folder of ``run_dir`` and return its name; every rank must call it. The folder is written
    as ``<name>.partial`` and renamed once every rank has finished; a failed write (a full disk)
    removes it and raises the ``OSError`` underneath on every rank."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    name = f"{SHARDED_PREFIX}{step:08d}"
    partial = run_dir / (name + _PARTIAL)
    if ctx.is_main:
        shutil.rmtree(partial, ignore_errors=True)  # left by a crash mid-save
    barrier(ctx)  # no rank writes into the folder before it is cleared
    state = {"model": get_model_state_dict(model)}
    for key, part in _optimizer_parts(optimizer).items():
        state[key] = get_optimizer_state_dict(model, part)
    try:
        with _one_process_is_intended():
            dcp.save(state, checkpoint_id=partial)  # ends with a barrier when there is a process group
    except dcp.CheckpointException as e:  # raised on every rank when any rank's write failed
        if ctx.is_main:
            shutil.rmtree(partial, ignore_errors=True)
        cause = _first_failure(e)
        if isinstance(cause, OSError):
            raise CheckpointError(describe_os_error(with_path(cause, partial))) from None
        # A full disk inside torch.save reaches here as torch's RuntimeError: the OSError under it
        # stays on the rank that failed.
        raise CheckpointError(
            f"could not write the sharded checkpoint {partial} ({one_line(cause)}); make sure its disk "
            f"has room and is writable, then continue with --resume"
        ) from None

    def publish() -> None:
        shutil.rmtree(run_dir / name, ignore_errors=True)  # the same step saved before a resume
        partial.rename(run_dir / name)

    decided_on_main(ctx, publish)
    return name


def load_sharded(run_dir: Path, name: str, model: nn.Module, optimizer: Any) -> None:
    """Load the checkpoint folder ``name`` into ``model`` and ``optimizer``, resharded to this
    run's processes (or into a plain model when there is one process). A damaged folder is a
    ``CheckpointError`` on every rank, naming it and the way on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
    )

    folder = run_dir / name
    if not folder.is_dir():
        raise _damaged(run_dir, folder, FileNotFoundError("the folder is missing"))
    parts = _optimizer_parts(optimizer)
    state = {"model": get_model_state_dict(model)}
    for key, part in parts.items():
        state[key] = get_optimizer_state_dict(model, part)
    try:
        # Its index first: unreadable, dcp.load would log tracebacks while it looks for others.
        dcp.FileSystemReader(folder).read_metadata()
    except Exception as e:  # noqa: BLE001 - missing, cut short or overwritten: the folder is unusable
        raise _damaged(run_dir, folder, e) from None
    try:
        with _one_process_is_intended():
            dcp.load(state, checkpoint_id=folder)
    except dcp.CheckpointException as e:  # a BaseException: no `except Exception` sees it
        raise _damaged(run_dir, folder, _first_failure(e)) from None
    set_model_state_dict(model, state["model"])
    for key, part in parts.items():
        set_optimizer_state_dict(model, part, state[key])


def _damaged(run_dir: Path, folder: Path, reason: BaseException) -> CheckpointError:
    return CheckpointError(
        f"cannot resume {run_dir}: its sharded checkpoint {folder} is damaged ({one_line(reason)}); its "
        f"weights are still whole in model.safetensors: start a new run from them with --set "
        f"train.init_from={run_dir} and another run.out_dir"
    )


def _first_failure(error: BaseException) -> BaseException:
    """The exception of the lowest rank that failed inside a ``CheckpointException`` (the OSError
    under it, where that rank's own exception still carries one)."""
    failures = getattr(error, "failures", None) or {}
    for rank in sorted(failures):
        cause = failures[rank]
        error = cause[0] if isinstance(cause, tuple) else cause
        break
    underneath: BaseException | None = error
    while underneath is not None and not isinstance(underneath, OSError):  # a full disk under torch's error
        underneath = underneath.__cause__ or underneath.__context__
    return underneath or error


@contextlib.contextmanager
def _one_process_is_intended() -> Iterator[None]:
    """Without a process group, torch.distributed.checkpoint warns that it assumes one process:
    here that is the plan (train.parallel=fsdp run, or resumed, by a single process)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def remove_stale_checkpoints(run_dir: Path, keep: str | None) -> None:
    """Delete every sharded checkpoint folder but ``keep`` (rank 0, after the state names it)."""
    for folder in run_dir.glob(SHARDED_PREFIX + "*"):
        if folder.name != keep and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
