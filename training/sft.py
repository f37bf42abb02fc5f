"""Supervised fine-tuning on conversations: the assistant-only loss, its evaluation, chat samples.

The loss of an optimizer step is the summed cross-entropy over every loss-bearing target of the
step (all micro-batches, all processes) divided by their count, so a long reply weighs what its
tokens weigh wherever it falls. The count is taken before the backward passes (one small
all-reduce per step), and clamped to at least 1: a step, or a micro-batch, with no loss-bearing
token then contributes a loss of 0 and zero gradients instead of the 0/0 = NaN a mean over no
targets gives.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch
import torch.nn.functional as F
from torch import nn

from data.batches.chat import iter_chat_val_batches
from data.prepared.chat import ChatSplit
from inference.engine import decode
from inference.sampling import SamplingSettings
from model.gpt import eval_mode
from training.distributed import DistContext, all_reduce_sum
from training.evaluate import EvalResult, score_batches, validation_bar


def summed_target_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over targets that are not -1 (0 when there are none)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1, reduction="sum")


def accumulate_chat_gradients(
    model: nn.Module,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    amp: Callable[[], ContextManager] | None = None,
    sync: Callable[[bool], ContextManager] | None = None,
    ctx: Any = None,
) -> torch.Tensor:
    """Backward the step's assistant-only loss; return it (detached, the same on every rank).

    Data-parallel gradients are averaged over ``world_size`` processes, so each process scales
    its summed loss by world_size / (targets of the whole step) to get the gradient of the mean.
    """
    world_size = ctx.world_size if ctx is not None else 1
    count = torch.stack([(y != -1).sum() for _, y in micro_batches]).sum().double()
    if ctx is not None:
        count = all_reduce_sum(count, ctx)
    scale = world_size / count.clamp(min=1)
    total = torch.zeros((), dtype=torch.float64, device=count.device)
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with sync(last) if sync is not None else contextlib.nullcontext():
            with amp() if amp is not None else contextlib.nullcontext():
                logits = model(x)
            loss = summed_target_loss(logits, y)
            (loss * scale.float()).backward()
        total += loss.detach().double()
    if ctx is not None:
        total = all_reduce_sum(total, ctx)
    return (total / count.clamp(min=1)).float()


def evaluate_chat(
    model: nn.Module,
    split: ChatSplit,
    token_bytes: torch.Tensor,
    *,
    batch_size: int,
    max_batches: int | None,
    pad_id: int,
    device: torch.device,
    amp: Callable[[], ContextManager] | None = None,
    ctx: DistContext = DistContext(),
    progress: bool = False,
) -> EvalResult:
    """Loss per assistant token (each reply's <|end|> included) and bits per byte of assistant
    text (the text of the replies: <|end|> has no bytes), over held-out conversations;
    ``progress`` shows a progress bar."""
    batches = iter_chat_val_batches(split, batch_size, pad_id=pad_id, max_batches=max_batches, device=device)
    if progress:
        batches = validation_bar(batches, len(split.lengths), batch_size, max_batches)
    return score_batches(model, batches, token_bytes, device=device, amp=amp, ctx=ctx)


def chat_reply_samples(
    model: Any, tokenizer: Any, split: ChatSplit, end_id: int, settings: SamplingSettings, *, count: int,
) -> list[tuple[str, str]]:
    """(prompt, reply) for the first reply of ``count`` held-out conversations spread over the split.

    One engine call decodes them together, sample i seeded ``settings.seed + i`` (the engine's
    rule), so the samples are a function of the weights alone. A reply ends at ``end_id`` (kept)
    or where the window is full, as a chat's does.
    """
    rows = sorted({round(i * (len(split) - 1) / max(count - 1, 1)) for i in range(count)})
    prompts = [p for p in map(split.first_reply_prompt, rows) if len(p) < model.config.block_size]
    if not prompts:
        return []
    with eval_mode(model):
        finishes = decode(model, prompts, settings, end_ids=[end_id], slide=False)
    return [(tokenizer.decode(prompt, skip_special_tokens=False),
             tokenizer.decode(list(finish.token_ids), skip_special_tokens=False))
            for prompt, finish in zip(prompts, finishes)]
