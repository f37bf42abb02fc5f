"""Sharded data parallelism (``train.parallel: fsdp``): FSDP2 over the blocks and the root, and the
checkpoints that go with it.

Each process holds 1/N of every weight, gradient and optimizer moment; a block's weights are
gathered just before its forward and backward and freed after. This buys memory, not speed: pick
it when the ``ddp`` estimate of training/memory_budget.py does not fit one device.

Checkpoints are written with ``torch.distributed.checkpoint`` (every rank writes its shards in
parallel, and a later run reshards them to its own world size, one process included). A save goes
to a temporary folder published by rename; the trainer state names the published folder, so a
crash before that state is replaced leaves the previous checkpoint whole.
"""

from __future__ import annotations

import contextlib
import shutil
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from model import GPT, GPTConfig
from rundir.files import SHARDED_PREFIX

# FSDP2's first forward fails on torch 2.6 (a CPU stream without record_event); 2.7 trains.
MIN_TORCH = (2, 7)
_PARTIAL = ".partial"  # a folder being written; never read


def torch_too_old(version: str) -> str | None:
    """The refusal for ``train.parallel=fsdp`` on torch ``version``, or None when it is new enough."""
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    if (major, minor) >= MIN_TORCH:
        return None
    return (f"train.parallel=fsdp needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (this is {version}); "
            f"upgrade with pip install -U 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}' or use train.parallel=ddp")


def shard_model(model: GPT, device: torch.device) -> GPT:
    """Shard every block, then the root (embeddings, final norm, head), over all processes.

    On CUDA the gathered weights compute in bf16 and gradients are reduced in fp32; on the CPU
    everything stays fp32. The module is changed in place (and returned): its parameters become
    DTensors, and its forward gathers and frees them.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_model_on_main(model: GPT, config: GPTConfig, is_main: bool, device: torch.device | None = None) -> GPT | None:
    """A plain, unsharded copy of ``model`` on rank 0 (None elsewhere), on ``device`` (default the
    CPU): what save_pretrained writes and what evaluation samples decode with. Every rank must
    call it: the weights are gathered from all of them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not is_main:
        return None
    plain = GPT(config)
    plain.load_state_dict(state)
    return plain.to(device) if device is not None else plain


def _optimizer_parts(optimizer: Any) -> dict[str, torch.optim.Optimizer]:
    """The torch optimizers inside the trainer's optimizer (Muon + AdamW is two)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return {"optimizer": optimizer}
    return {"muon": optimizer.muon, "adamw": optimizer.adamw}


def save_sharded(run_dir: Path, step: int, model: nn.Module, optimizer: Any, is_main: bool) -> str:
    """Write the weights and optimizer state of ``step`` with torch.distributed.checkpoint into a
    new folder of ``run_dir`` and return its name; every rank must call it. The folder is written
    as ``<name>.partial`` and renamed once every rank has finished."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    name = f"{SHARDED_PREFIX}{step:08d}"
    partial = run_dir / (name + _PARTIAL)
    if is_main:
        shutil.rmtree(partial, ignore_errors=True)  # left by a crash mid-save
    if dist.is_initialized():
        dist.barrier()  # no rank writes into the folder before it is cleared
    state = {"model": get_model_state_dict(model)}
    for key, part in _optimizer_parts(optimizer).items():
        state[key] = get_optimizer_state_dict(model, part)
    with _one_process_is_intended():
        dcp.save(state, checkpoint_id=partial)  # ends with a barrier when there is a process group
    if is_main:
        shutil.rmtree(run_dir / name, ignore_errors=True)  # the same step saved before a resume
        partial.rename(run_dir / name)
    if dist.is_initialized():
        dist.barrier()
    return name


def load_sharded(run_dir: Path, name: str, model: nn.Module, optimizer: Any) -> None:
    """Load the checkpoint folder ``name`` into ``model`` and ``optimizer``, resharded to this
    run's processes (or into a plain model when there is one process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
    )

    folder = run_dir / name
    if not folder.is_dir():
        raise FileNotFoundError(f"the sharded checkpoint {folder} is missing")
    parts = _optimizer_parts(optimizer)
    state = {"model": get_model_state_dict(model)}
    for key, part in parts.items():
        state[key] = get_optimizer_state_dict(model, part)
    with _one_process_is_intended():
        dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(model, state["model"])
    for key, part in parts.items():
        set_optimizer_state_dict(model, part, state[key])


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
