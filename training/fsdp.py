"""Sharded data parallelism (``train.parallel: fsdp``), imported only by a run that asks for it: FSDP2
over the blocks and the root (``training.distributed.shard_model``). Each process holds 1/N of every
weight, gradient and moment, gathering a block's weights around its forward and backward: memory, not
speed, for when ``ddp`` does not fit (training/memory_budget.py). Here: the torch it needs, and its
checkpoint (``ShardedCheckpointer``, with ``training.checkpointing.Checkpointer``'s methods)."""

import contextlib
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from common.errors import describe_os_error, one_line, with_path
from model.config import GPTConfig
from model.gpt import GPT
from rundir.checkpoint import CheckpointError, save_checkpoint
from rundir.files import SHARDED_PREFIX
from training.adapters import Adapters
from training.distributed import DistContext, barrier, decided_on_main, is_sharded

# FSDP2's first forward fails on torch 2.6 (a CPU stream without record_event); 2.7 trains.
MIN_TORCH = (2, 7)


def torch_too_old(version: str) -> str | None:
    """The refusal for ``train.parallel=fsdp`` on torch ``version``, or None when it is new enough."""
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    if (major, minor) >= MIN_TORCH:
        return None
    return (f"train.parallel=fsdp needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (this is {version}); "
            f"upgrade with pip install -U 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}' or use train.parallel=ddp")


@dataclass(frozen=True)
class ShardedCheckpointer:
    """The checkpoint of ``train.parallel: fsdp``: the weights and optimizer state in the sharded folder
    that the trainer state names, and ``model.safetensors`` gathered whole, as in any run."""

    run_dir: Path
    ctx: DistContext
    model_config: GPTConfig
    device: torch.device
    adapters: Adapters

    def whole_model(self, model: GPT) -> GPT | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if not is_sharded(model):  # fsdp in a single process holds the model whole
            return model
        # Gathered from every rank into the CPU memory of rank 0 alone.
        whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.ctx.is_main:
            return None
        plain = GPT(self.model_config)
        plain.load_state_dict(whole)
        return plain.to(self.device)

    def save(self, model: GPT, optimizer: Any, state: dict[str, Any], *, weights: bool = True) -> None:
        """A full disk or a read-only folder is one line on every rank, and the partial folder
        is removed."""
        import torch.distributed.checkpoint as dcp

        name = f"{SHARDED_PREFIX}{state['step']:08d}"
        partial = self.run_dir / f"{name}.partial"  # never read
        if self.ctx.is_main:
            shutil.rmtree(partial, ignore_errors=True)  # left by a crash mid-save
        barrier(self.ctx)  # no rank writes into the folder before it is cleared
        try:
            with _one_process_is_intended():
                dcp.save(_sharded_state(model, optimizer), checkpoint_id=partial)  # ends with a barrier
        except dcp.CheckpointException as e:  # raised on every rank when any rank's write failed
            if self.ctx.is_main:
                shutil.rmtree(partial, ignore_errors=True)
            cause = _first_failure(e)
            if isinstance(cause, OSError):
                raise CheckpointError(describe_os_error(with_path(cause, partial))) from None
            raise CheckpointError(  # torch's error over a full disk, its OSError left on the failed rank
                f"could not write the sharded checkpoint {partial} ({one_line(cause)}); make sure its "
                f"disk has room and is writable, then continue with --resume"
            ) from None
        plain = self.whole_model(model) if weights else None

        def publish() -> None:
            shutil.rmtree(self.run_dir / name, ignore_errors=True)  # the same step saved before a resume
            partial.rename(self.run_dir / name)
            try:
                save_checkpoint(self.run_dir, plain, {**state, "sharded": name})
            except BaseException:
                shutil.rmtree(self.run_dir / name, ignore_errors=True)  # the state names the one before
                raise
            for folder in self.run_dir.glob(SHARDED_PREFIX + "*"):  # the checkpoints before
                if folder.name != name and folder.is_dir():
                    shutil.rmtree(folder, ignore_errors=True)

        decided_on_main(self.ctx, publish)

    def restore(self, state: dict[str, Any], model: GPT, optimizer: Any) -> None:
        """Reshards to this run's processes (a plain model when there is one); a damaged folder is
        one line on every rank, naming it and the way on."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        folder = self.run_dir / state["sharded"]
        sharded = _sharded_state(model, optimizer)
        try:
            # Its index first: an unreadable one makes dcp.load log tracebacks while it looks for others.
            dcp.FileSystemReader(folder).read_metadata()
        except Exception as e:  # noqa: BLE001 - missing, cut short or overwritten: the folder is unusable
            raise self._damaged(folder, e) from None
        try:
            with _one_process_is_intended():
                dcp.load(sharded, checkpoint_id=folder)
        except dcp.CheckpointException as e:  # a BaseException: no `except Exception` sees it
            raise self._damaged(folder, _first_failure(e)) from None
        set_model_state_dict(model, sharded.pop("model"))
        for key, part in _optimizer_parts(optimizer).items():
            set_optimizer_state_dict(model, part, sharded[key])

    def _damaged(self, folder: Path, reason: BaseException) -> CheckpointError:
        return CheckpointError(
            f"cannot resume {self.run_dir}: its sharded checkpoint {folder} is damaged ({one_line(reason)}); "
            f"its weights are still whole in model.safetensors: start a new run from them with --set "
            f"train.init_from={self.run_dir} and another run.out_dir"
        )


def _optimizer_parts(optimizer: Any) -> dict[str, torch.optim.Optimizer]:
    """The torch optimizers inside the trainer's optimizer (Muon + AdamW is two)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return {"optimizer": optimizer}
    return {"muon": optimizer.muon, "adamw": optimizer.adamw}


def _sharded_state(model: GPT, optimizer: Any) -> dict[str, Any]:
    """This rank's part of the weights and of each optimizer's state, as torch.distributed.checkpoint
    writes and fills them."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"model": get_model_state_dict(model)}
    for key, part in _optimizer_parts(optimizer).items():
        state[key] = get_optimizer_state_dict(model, part)
    return state


def _first_failure(error: BaseException) -> BaseException:
    """The exception of the lowest rank that failed inside a ``CheckpointException``, or the OSError
    under it where that rank's own exception still carries one."""
    failures = getattr(error, "failures", None) or {}
    if failures:
        first = failures[min(failures)]
        error = first[0] if isinstance(first, tuple) else first
    underneath: BaseException | None = error
    while underneath is not None and not isinstance(underneath, OSError):
        underneath = underneath.__cause__ or underneath.__context__
    return underneath or error


@contextlib.contextmanager
def _one_process_is_intended() -> Iterator[None]:
    """Without a process group, torch.distributed.checkpoint warns that it assumes one process:
    here that is the plan (train.parallel=fsdp run, or resumed, by a single process)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield
