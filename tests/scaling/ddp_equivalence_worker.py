"""Under torchrun (``two_rank_steps_worker.py``): a data-parallel step equals a single-process one,
A. 2 ranks × 1 micro-batch vs 1 process accumulating 2;
B. 2 ranks × 2 vs 1 process accumulating 4 (the first micro-step must not communicate).
Rank 1 starts from another seed on purpose: ``wrap_model`` must hand every rank rank 0's weights."""

import torch

from model.config import GPTConfig
from model.gpt import GPT, unwrap
from training.distributed import all_reduce_mean, gather_to_main, split_batch, sync_gradients, wrap_model

CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
MICRO_BATCH = 2


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))


def micro_batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batch as ``count`` micro-batches, identical on every rank."""
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, CONFIG.vocab_size, (count, MICRO_BATCH, CONFIG.block_size + 1), generator=g)
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def fresh_model(seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(CONFIG)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in unwrap(model).parameters()])


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in unwrap(model).parameters()])


def reference_step(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One process, all micro-batches accumulated: the update data parallelism must reproduce."""
    model = fresh_model(seed=0)
    opt = make_optimizer(model)
    total = 0.0
    for x, y in batches:
        _, loss = model(x, targets=y)
        (loss / len(batches)).backward()
        total += loss.item()
    grads = flat_grads(model)
    opt.step()
    return flat_params(model), grads, total / len(batches)


def ddp_step(ctx, num_micro_batches: int) -> dict:
    accum = split_batch(MICRO_BATCH, num_micro_batches, ctx.world_size).micro_steps
    batches = micro_batches(num_micro_batches)
    mine = batches[ctx.rank * accum : (ctx.rank + 1) * accum]  # each rank its own share

    model = wrap_model(fresh_model(seed=ctx.rank), ctx)
    opt = make_optimizer(model)
    start_equal = gather_to_main(flat_params(model), ctx)

    # Count gradient all-reduces per micro-step with a comm hook that wraps the default one.
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    calls = {"n": 0}

    def counting_allreduce(state, bucket):
        calls["n"] += 1
        return default_hooks.allreduce_hook(None, bucket)

    model.register_comm_hook(None, counting_allreduce)
    calls_per_micro_step = []
    loss_sum = 0.0
    for i, (x, y) in enumerate(mine):
        before = calls["n"]
        with sync_gradients(model, i == accum - 1):
            _, loss = model(x, targets=y)
            (loss / accum).backward()
        calls_per_micro_step.append(calls["n"] - before)
        loss_sum += loss.item()
    grads = flat_grads(model)
    opt.step()
    mean_loss = all_reduce_mean(loss_sum / accum, ctx)

    final = gather_to_main(flat_params(model), ctx)
    # On every rank, none left waiting (worker_testkit says why).
    expected, expected_grads, expected_loss = reference_step(batches)
    if not ctx.is_main:
        return {}
    return {
        "accum": accum,
        "calls_per_micro_step": calls_per_micro_step,
        "start_max_diff_between_ranks": (start_equal[0] - start_equal[1]).abs().max().item(),
        "max_diff_between_ranks": (final[0] - final[1]).abs().max().item(),
        "max_diff_vs_single_process": (final[0] - expected).abs().max().item(),
        "max_grad_diff_vs_single_process": (grads - expected_grads).abs().max().item(),
        "max_grad": expected_grads.abs().max().item(),
        "max_param_change": (final[0] - flat_params(fresh_model(seed=0))).abs().max().item(),
        "loss": mean_loss,
        "single_process_loss": expected_loss,
    }


def measure(ctx) -> dict:
    return {"A": ddp_step(ctx, num_micro_batches=2), "B": ddp_step(ctx, num_micro_batches=4)}
