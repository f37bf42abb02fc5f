"""Group relative policy optimisation (GRPO): sample a group, score it with a program, push the policy.

For each prompt the policy π samples a group of G completions through the engine, reward functions
(``training.tasks.grpo.rewards``) score them, and A_i = (r_i − mean(r)) / (std(r) + 1e-4): a
completion is pushed up exactly when it beat its siblings. Every token t of o_i then carries

    ratio = π(o_i,t | q, o_i,<t) / π_old(o_i,t | ...)
    loss  = −min(ratio · A_i, clip(ratio, 1 − ε, 1 + ε) · A_i) + β · KL_t
    KL_t  = π_ref/π − log(π_ref/π) − 1        (the k3 estimator: ≥ 0, unbiased for KL(π‖π_ref))

π_old sampled the batch (the ratio is 1 on the first update; with ``rl.updates_per_batch`` > 1 the
clip keeps later ones near it). π_ref is frozen: the ``train.init_from`` run, or under LoRA the same
model with its adapters off, so no second copy is held.

The step's loss is DAPO's token mean (TRL's default, ``loss_type="dapo"``): GRPO's sequence mean
weighs a token of a long completion less, letting long wrong answers off lightly, and Dr. GRPO's
division by max_new_tokens ties the step size to a length budget.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from training.distributed import DistContext, all_reduce_sum

Amp = Callable[[], ContextManager]
STD_EPS = 1e-4  # TRL's, added to a group's standard deviation


@dataclass
class Rollout:
    """A sampled batch, ready for updates: G completions per prompt, consecutive rows per group, laid
    out as a chat batch; ``old_logps`` None for one update (π_old is the policy), ``ref_logps`` for β 0."""

    x: torch.Tensor
    y: torch.Tensor
    advantages: torch.Tensor
    old_logps: torch.Tensor | None
    ref_logps: torch.Tensor | None
    metrics: dict[str, float]

    def state(self) -> dict[str, Any]:
        """Plain tensors and numbers on the CPU, for a checkpoint."""
        return {f.name: (value.cpu() if isinstance(value := getattr(self, f.name), torch.Tensor) else value)
                for f in fields(self)}

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> Rollout:
        return cls(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in state.items()})


# --------------------------------------------------------------------------------------------
# The arithmetic of the loss


def group_advantages(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(each completion's advantage, its group's reward standard deviation) for ``rewards`` laid
    out group after group. The deviation is Bessel-corrected, as TRL's."""
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    return ((grouped - mean) / (std + STD_EPS)).flatten(), std.expand_as(grouped).flatten()


def target_logps(logits: torch.Tensor, y: torch.Tensor, temperature: float) -> torch.Tensor:
    """Each target's log-probability (fp32) under ``logits / temperature``; 0 where y is −1."""
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    picked = logps.gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked * (y != -1)


def token_losses(
    logps: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor | None, advantages: torch.Tensor,
    *, epsilon: float, beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-token loss, per-token KL, tokens clipped low, tokens clipped high), all (rows, T), from
    per-token log-probabilities and per-row advantages; the mask is applied by the caller."""
    ratio = torch.exp(logps - old_logps)
    a = advantages.unsqueeze(1)
    loss = -torch.min(ratio * a, ratio.clamp(1 - epsilon, 1 + epsilon) * a)
    if ref_logps is not None and beta > 0:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        loss = loss + beta * kl
    else:
        kl = torch.zeros_like(loss)
    # The tokens whose gradient the clip removed (TRL's clip_ratio/low and /high).
    low = (ratio < 1 - epsilon) & (a < 0)
    high = (ratio > 1 + epsilon) & (a > 0)
    return loss, kl.detach(), low, high


# --------------------------------------------------------------------------------------------
# The update


def accumulate_grpo_gradients(
    model: nn.Module, rollout: Rollout, micro_steps: int, *, epsilon: float, beta: float, temperature: float,
    amp: Amp | None = None, sync: Callable[[bool], ContextManager] | None = None, ctx: DistContext = DistContext(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """Backward the step's token-mean loss over ``rollout`` in ``micro_steps`` micro-batches of whole
    rows (each sum divided by the step's token count); return it (detached, this process's) and the
    step's KL and clip ratios over every process's tokens."""
    mask = rollout.y != -1
    total = all_reduce_sum(mask.sum().double(), ctx).clamp(min=1)
    sums = torch.zeros(4, dtype=torch.float64, device=rollout.x.device)  # loss, kl, low, high
    chunks = torch.arange(len(rollout.x), device=rollout.x.device).tensor_split(micro_steps)
    for i, rows in enumerate(chunks):
        with sync(i == micro_steps - 1) if sync is not None else contextlib.nullcontext():
            with amp() if amp is not None else contextlib.nullcontext():
                logits = model(rollout.x[rows])
            y, m = rollout.y[rows], mask[rows]
            logps = target_logps(logits, y, temperature)
            old = logps.detach() if rollout.old_logps is None else rollout.old_logps[rows]
            ref = None if rollout.ref_logps is None else rollout.ref_logps[rows]
            losses, kl, low, high = token_losses(logps, old, ref, rollout.advantages[rows], epsilon=epsilon,
                                                 beta=beta)
            ((losses * m).sum() / total * ctx.world_size).backward()
        sums += torch.stack([(losses.detach() * m).sum(), (kl * m).sum(), (low & m).sum(), (high & m).sum()]).double()
    loss = (sums[0] / total * ctx.world_size).float()
    reduced = (all_reduce_sum(sums, ctx) / total).tolist()
    metrics = {"kl": reduced[1], "clip_ratio/low_mean": reduced[2], "clip_ratio/high_mean": reduced[3],
               "clip_ratio/region_mean": reduced[2] + reduced[3]}
    return loss, metrics
