"""Supervised fine-tuning on conversations (``data.format: chat``): the assistant-only loss, its
evaluation, chat samples, and the task that trains on them (``ChatTask``).

The loss of an optimizer step is the summed cross-entropy over every loss-bearing target of the
step (all micro-batches, all processes) divided by their count, so a long reply weighs what its
tokens weigh wherever it falls. The count is taken before the backward passes (one small
all-reduce per step), and clamped to at least 1: a step, or a micro-batch, with no loss-bearing
token then contributes a loss of 0 and zero gradients instead of the 0/0 = NaN a mean over no
targets gives.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch
import torch.nn.functional as F
from torch import nn

from data.batches.chat import ChatBatches, iter_chat_val_batches
from data.prepared.chat import ChatSplit, prepare_chat_data
from inference.engine import decode
from inference.sampling import SamplingSettings
from model.gpt import eval_mode
from training.adapters import Adapters
from training.config import Config
from training.distributed import DistContext, all_reduce_sum
from training.evaluate import EvalResult, score_batches, validation_bar
from training.tasks.task import Batches, Task, fitted, parent_tokenizer, sample_line

CHAT_SAMPLES = 4  # held-out conversations a chat run replies to at each evaluation


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


class ChatTask(Task):
    """Supervised fine-tuning on conversations: the loss is the assistant's replies alone."""

    is_chat = True
    sample_prompt = None

    def batches(self, batch_size: int, **placement: Any) -> Batches:
        return ChatBatches(self.prepared.train, batch_size, pad_id=self.prepared.eot_id, **placement)

    def accumulate(self, model, batches, micro_steps, *, amp, sync, ctx, stop):
        # Assistant-only loss over every loss-bearing target of the step, on all ranks together:
        # its count is needed before the first backward, so the step's batches are drawn first.
        micro_batches = [batches.next() for _ in range(micro_steps)]
        loss = accumulate_chat_gradients(model, micro_batches, amp=amp, sync=sync, ctx=ctx)
        return loss, sum(x.numel() for x, _ in micro_batches) * ctx.world_size

    def evaluate(self, model, **shared):
        # Loss and bits/byte of the replies only, over held-out conversations.
        return evaluate_chat(model, self.prepared.val, self.token_bytes, pad_id=self.prepared.eot_id, **shared)

    def samples(self, model, settings):
        end_id = self.tokenizer.token_to_id("<|end|>")
        return chat_reply_samples(model, self.tokenizer, self.prepared.val, end_id, settings, count=CHAT_SAMPLES)

    def sample_fields(self, samples):
        return {"samples": [{"prompt": p, "reply": r} for p, r in samples]}

    def eval_line(self, scope, step, result, samples):
        lines = [f"step {step} {scope}: assistant loss {result.loss:.4f} nats/token, "
                 f"{result.bpb:.4f} bits/byte of assistant text"]
        lines += [sample_line(prompt + reply) for prompt, reply in samples[:1]]
        return "\n".join(lines)

    def train_fields(self, batches):
        return {"padding_fraction": batches.padding_fraction}

    def describe_batches(self, batches):
        return f"chat batches: {100 * batches.epoch_padding_fraction():.1f}% of computed tokens are padding"


def build(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool, device: torch.device,
          adapters: Adapters, resume: bool = False) -> ChatTask:
    """The conversations of ``config.data``, rendered with the parent run's tokenizer."""
    prepared = prepare_chat_data(config.data, parent_tokenizer(config, tokenizer_file), config.model.block_size,
                                 progress=progress, is_main=is_main)
    return ChatTask(fitted(prepared, config), device)
