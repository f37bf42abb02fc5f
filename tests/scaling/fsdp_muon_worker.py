"""Under torchrun: Muon + AdamW on FSDP-sharded weights (2 ranks × 2 micro-batches) take the steps of
an unsharded copy on the whole batch; rank 0 writes the largest weight difference and change as JSON."""

import contextlib
import sys
from pathlib import Path

import torch

from model.config import GPTConfig
from model.gpt import GPT
from training.adapters import Adapters
from training.fsdp import ShardedCheckpointer
from training.config import TrainConfig
from training.distributed import sync_gradients, wrap_model
from training.optim import build_optimizer, plan_param_groups
from worker_testkit import run_worker

STEPS, MICRO, ROWS = 3, 4, 2  # optimizer steps; micro-batches per global batch; rows per micro-batch
OPTIM = TrainConfig(max_steps=STEPS, optimizer="muon", lr=3e-3, muon_lr=0.02, weight_decay=0.1)


def model_config(attention: str) -> GPTConfig:
    if attention == "mla":
        return GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=4, n_embd=32,
                         attention="mla", kv_latent_dim=16, value_embeddings=False)
    return GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, value_embeddings=True)


def batches(config: GPTConfig, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, config.vocab_size, (MICRO, ROWS, config.block_size + 1), generator=g)
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def train(model: torch.nn.Module, config: GPTConfig, share: slice, sync=None) -> None:
    optimizer = build_optimizer(plan_param_groups(model, OPTIM), OPTIM, torch.device("cpu"))
    for step in range(STEPS):
        mine = batches(config, step)[share]
        for i, (x, y) in enumerate(mine):
            with sync(i == len(mine) - 1) if sync else contextlib.nullcontext():
                _, loss = model(x, y)
                (loss / len(mine)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def compare(ctx, attention: str) -> dict:
    config = model_config(attention)
    torch.manual_seed(0)
    model = wrap_model(GPT(config), ctx, parallel="fsdp")
    half = MICRO // ctx.world_size
    train(model, config, slice(ctx.rank * half, (ctx.rank + 1) * half), lambda last: sync_gradients(model, last))
    sharded = ShardedCheckpointer(Path(), ctx, config, torch.device("cpu"), Adapters()).whole_model(model)
    # On every rank, none left waiting (worker_testkit says why).
    torch.manual_seed(0)
    reference = GPT(config)
    start = {k: v.clone() for k, v in reference.state_dict().items()}
    train(reference, config, slice(None))
    if not ctx.is_main:
        return {}
    got, want = sharded.state_dict(), reference.state_dict()
    return {
        "max_diff": max((got[k] - want[k]).abs().max().item() for k in want),
        "max_change": max((want[k] - start[k]).abs().max().item() for k in want),
    }


def main(out_path: str) -> None:
    run_worker(out_path, lambda ctx: {"gqa": compare(ctx, "gqa"), "mla": compare(ctx, "mla")})

if __name__ == "__main__":
    main(sys.argv[1])
