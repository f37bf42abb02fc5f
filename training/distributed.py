"""Data-parallel training across processes started by ``torchrun``, one per device.

Without ``torchrun`` everything here is a cheap no-op, so the trainer has a single code path.
DDP averages gradients over processes and each process averages over its micro-steps, so the
update is the one a single process would make on the whole global batch."""

import contextlib
import ctypes
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from common.errors import UserError, describe_os_error
from common.device import select_device

T = TypeVar("T")

# Variables torchrun sets in every worker; RANK alone is not enough (a user may export it).
_TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass(frozen=True)
class DistContext:
    """Where this process sits among its peers. The default is a plain single process."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    is_main: bool = True
    enabled: bool = False  # True when a process group with more than one process is live
    backend: str | None = None  # "nccl" | "gloo" when enabled


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in _TORCHRUN_ENV)


def init_distributed(device_pref: str = "auto") -> DistContext:
    """Join the process group torchrun set up (NCCL between GPUs, gloo between CPU processes), or
    describe a single process. Each process takes the GPU numbered by its LOCAL_RANK."""
    if launched_by_torchrun():
        rank, local_rank, world_size = _env_int("RANK"), _env_int("LOCAL_RANK"), _env_int("WORLD_SIZE")
        end_with_launcher()
    else:
        rank, local_rank, world_size = 0, 0, 1
    if world_size == 1:
        # A single process (or torchrun with one): nothing to synchronise, no process group, no DDP.
        return DistContext(device=select_device(device_pref, setting="train.device"))
    device = _device_for_rank(device_pref, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # Binding the group to this GPU lets barriers and collectives know their device up
        # front (no guessing, no warning) and creates the NCCL communicator eagerly.
        device_id = device if device.type == "cuda" else None
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, device_id=device_id)
    return DistContext(rank, world_size, device, is_main=rank == 0, enabled=True, backend=backend)


def end_with_launcher() -> None:
    """Stop this worker when the torchrun that started it is gone (a SIGKILLed torchrun would leave
    orphans holding the run directory): ``prctl(PR_SET_PDEATHSIG)`` sends SIGTERM, which the trainer
    obeys as any stop request. No watching thread: with one, a resumed fsdp run drifted from an
    uninterrupted one. Only under torchrun's agent (``TORCHELASTIC_RUN_ID``), on Linux."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher:  # it was gone before the kernel was asked to tell
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass(frozen=True)
class BatchSplit:
    """How one optimizer step's sequences are shared: per process, per micro-batch."""

    batch_size: int  # sequences per micro-batch on each process
    micro_steps: int  # micro-batches each process accumulates per optimizer step


def split_batch(batch_size: int, grad_accum_steps: int, world_size: int) -> BatchSplit:
    """Share the config's optimizer step (batch_size x grad_accum_steps sequences) among processes,
    dividing the accumulation steps when they divide evenly (the per-process memory stays as
    configured), else the per-process batch."""
    if grad_accum_steps % world_size == 0:
        return BatchSplit(batch_size, grad_accum_steps // world_size)
    if batch_size % world_size == 0:
        return BatchSplit(batch_size // world_size, grad_accum_steps)
    divisors = sorted({n for n in range(2, 65) if grad_accum_steps % n == 0 or batch_size % n == 0})
    counts = ", ".join(map(str, divisors[:8])) or "1"
    raise UserError(
        f"the global batch of {batch_size} x {grad_accum_steps} sequences (train.batch_size x "
        f"train.grad_accum_steps) cannot be shared by {world_size} processes: neither divides by "
        f"{world_size}; launch {counts} processes, or set train.grad_accum_steps to a multiple of {world_size}"
    )


def wrap_model(model: nn.Module, ctx: DistContext, parallel: str = "ddp") -> nn.Module:
    """The one place the model is wrapped for multi-process training: DDP, or FSDP2 in place
    (``shard_model``). Call it before ``torch.compile``, so communication overlaps the backward.
    DDP broadcasts rank 0's weights; FSDP's slices agree because every rank built the same model."""
    if not ctx.enabled:
        return model
    if parallel == "fsdp":
        return shard_model(model, ctx.device)
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def shard_model(model: nn.Module, device: torch.device) -> nn.Module:
    """Shard every block, then the root, over all processes, in place (the parameters become
    DTensors); on CUDA gathered weights compute in bf16 and gradients reduce in fp32."""
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


@contextlib.contextmanager
def sync_gradients(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Run one micro-step's backward; all-reduce the gradients only when ``enabled`` (the last
    micro-step), so earlier ones accumulate locally without communication."""
    ddp = getattr(model, "_orig_mod", model)  # through torch.compile's wrapper
    if hasattr(ddp, "set_requires_gradient_sync"):  # FSDP2: keep unsharded gradients until the last
        ddp.set_requires_gradient_sync(enabled)
        yield
        return
    skip_sync = not enabled and isinstance(ddp, DistributedDataParallel)
    with ddp.no_sync() if skip_sync else contextlib.nullcontext():
        yield


def shared_failure(ctx: DistContext, action: Callable[[], T]) -> T:
    """Run ``action`` on every rank and make a failure of any rank every rank's (the failing rank
    raises its own error, the others a ``UserError`` with its line), so no rank waits in the next
    collective for a peer that is gone."""
    result, failure, line = None, None, None
    try:
        result = action()
    except UserError as e:
        failure, line = e, str(e)
    except OSError as e:  # under torchrun the same line as the others, not train.py's own
        line = describe_os_error(e)
        failure = UserError(line) if ctx.enabled else e
    except BaseException as e:  # a bug or an interrupt: the others only learn that this rank stopped
        failure, line = e, f"rank {ctx.rank} stopped ({type(e).__name__}); see its output"
    if ctx.enabled:
        lines: list[str | None] = [None] * ctx.world_size
        dist.all_gather_object(lines, line)
        line = next((shared for shared in lines if shared is not None), None)
    if failure is not None:
        raise failure
    if line is not None:
        raise UserError(line)
    return result


def decided_on_main(ctx: DistContext, action: Callable[[], T]) -> T | None:
    """Run ``action`` on rank 0 alone (checks and writes of the run directory), its failure every
    rank's as ``shared_failure`` makes it."""
    return shared_failure(ctx, lambda: action() if ctx.is_main else None)


def all_gather_rows(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Every rank's ``value`` (the same shape on each), concatenated along the first dimension in
    rank order: the rows of the whole step, for metrics that every process agrees on."""
    if not ctx.enabled:
        return value
    local = value.detach().to(ctx.device).contiguous()  # NCCL gathers on this rank's GPU
    parts = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts).to(value.device)


def barrier(ctx: DistContext) -> None:
    """Wait until every process gets here (no-op for a single process)."""
    if ctx.enabled:
        dist.barrier()


def all_reduce_mean(value: torch.Tensor | float, ctx: DistContext) -> torch.Tensor | float:
    """The mean of ``value`` over processes (returned as the type given; input left untouched)."""
    return _all_reduce(value, ctx, mean=True)


def all_reduce_sum(value: torch.Tensor | float, ctx: DistContext) -> torch.Tensor | float:
    """The sum of ``value`` over processes, e.g. nats and bytes of a sharded validation pass."""
    return _all_reduce(value, ctx, mean=False)


def gather_to_main(obj: Any, ctx: DistContext) -> list[Any] | None:
    """Every rank's ``obj`` (a picklable value) as a list indexed by rank, on rank 0 only."""
    if not ctx.enabled:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    # all_gather_object rather than gather_object: it works the same on gloo and NCCL, and these
    # objects are small and gathered only at checkpoints.
    dist.all_gather_object(gathered, obj)
    return gathered if ctx.is_main else None


def select_rank_state(
    saved: list[Any] | None, saved_world_size: int | None, ctx: DistContext
) -> tuple[Any | None, str | None]:
    """This rank's entry of per-rank state saved by ``gather_to_main``; ``(None, message)`` under
    another world size, whose batch order then starts afresh."""
    if saved is None or saved_world_size is None:
        return None, None
    if saved_world_size == ctx.world_size and len(saved) == ctx.world_size:
        return saved[ctx.rank], None
    return None, (
        f"resuming a run saved with {saved_world_size} process(es) on {ctx.world_size}: weights, "
        f"optimizer state and step count continue, but the batch order starts afresh for each "
        f"process (resume with {saved_world_size} process(es) to continue it exactly)"
    )


def shutdown(ctx: DistContext) -> None:
    """Leave the process group (safe to call more than once, or without one)."""
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def _all_reduce(value: torch.Tensor | float, ctx: DistContext, *, mean: bool) -> torch.Tensor | float:
    if not ctx.enabled:
        return value
    # float64 so that sums of many large numbers (nats over a validation split) stay exact
    # enough; NCCL needs the tensor on this rank's GPU.
    t = torch.as_tensor(value, dtype=torch.float64).detach().to(ctx.device, copy=True)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    if mean:
        t /= ctx.world_size
    return t.to(device=value.device, dtype=value.dtype) if isinstance(value, torch.Tensor) else t.item()


def _device_for_rank(device_pref: str, local_rank: int) -> torch.device:
    pref = device_pref.strip()
    if pref == "auto":
        pref = "cuda" if torch.cuda.is_available() else "cpu"
    if pref == "cpu":
        return torch.device("cpu")
    if pref == "cuda":
        if not torch.cuda.is_available():
            raise UserError("train.device=cuda but CUDA is not available; use train.device=cpu")
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise UserError(
                f"local rank {local_rank} has no GPU: this node has {count}; launch at most "
                f"{count} process(es) per node with torchrun --nproc_per_node"
            )
        return torch.device("cuda", local_rank)
    if pref.startswith("cuda:"):
        raise UserError(
            f"train.device={pref} names one GPU but torchrun starts a process per GPU; use "
            f"train.device=cuda (process i takes GPU i) and choose GPUs with CUDA_VISIBLE_DEVICES"
        )
    raise UserError(
        f"train.device={pref} is not supported with torchrun; use train.device=cuda or cpu"
    )


def _env_int(name: str) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text)
    except ValueError:
        raise UserError(f"environment variable {name}={text!r} is not an integer; launch with torchrun") from None
