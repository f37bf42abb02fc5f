"""Sharded data parallelism (``train.parallel: fsdp``): FSDP2 over the blocks and the root. Each
process holds 1/N of every weight, gradient and moment, gathering a block's weights around its
forward and backward: memory, not speed, for when ``ddp`` does not fit (training/memory_budget.py).
"""

from __future__ import annotations

import torch

from model.gpt import GPT

# FSDP2's first forward fails on torch 2.6 (a CPU stream without record_event); 2.7 trains.
MIN_TORCH = (2, 7)


def torch_too_old(version: str) -> str | None:
    """The refusal for ``train.parallel=fsdp`` on torch ``version``, or None when it is new enough."""
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    if (major, minor) >= MIN_TORCH:
        return None
    return (f"train.parallel=fsdp needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (this is {version}); "
            f"upgrade with pip install -U 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}' or use train.parallel=ddp")


def shard_model(model: GPT, device: torch.device) -> GPT:
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
