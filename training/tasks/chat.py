"""Supervised fine-tuning on conversations (``data.format: chat``): the assistant-only loss, its
evaluation, chat samples, and the task that trains on them (``ChatTask``).

A step's loss is the summed cross-entropy over every loss-bearing target of the step (all
micro-batches and processes) divided by their count, taken before the backward passes and clamped
to at least 1, so a long reply weighs what its tokens weigh and a step with no target gives zero
gradients rather than NaN."""

import contextlib
from pathlib import Path
from typing import Any, Callable, ContextManager, Sized

import torch
import torch.nn.functional as F
from torch import nn

from data.batches.chat import ChatBatches, iter_chat_val_batches
from data.chat import ChatTokenIds
from data.prepared.chat import ChatSplit, prepare_chat_data
from inference.engine import Finish, decode
from inference.sampling import SamplingSettings
from model.gpt import eval_mode
from training.adapters import Adapters
from training.config import Config
from training.distributed import DistContext, all_reduce_sum
from training.evaluate import EvalResult, score_batches, validation_bar
from training.result import Words
from training.tasks.task import Batches, Task, fitted, parent_tokenizer

CHAT_SAMPLES = 4  # held-out conversations a chat run replies to at each evaluation
# How many held-out replies the final evaluation samples to see how many end their turn, at most how
# long each may run (SamplingSettings' default, as generate.py's), and the seed of the first.
ENDING_REPLIES = 200
ENDING_MAX_TOKENS = SamplingSettings.max_new_tokens
ENDING_SEED = 0


def accumulate_chat_gradients(
    model: nn.Module,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    amp: Callable[[], ContextManager] | None = None,
    sync: Callable[[bool], ContextManager] | None = None,
    ctx: Any = None,
) -> torch.Tensor:
    """Backward the step's assistant-only loss; return it (detached, the same on every rank). DDP
    averages gradients over processes, so each scales its sum by world_size / (the step's targets)."""
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
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=-1, reduction="sum")
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
    """Loss per assistant token and bits per byte of assistant text over held-out conversations;
    ``progress`` shows a progress bar. Both charge each reply's <|end|>: its nats count, over the
    bytes of the replies' text (it has none), so a model that does not end its turns scores worse."""
    batches = iter_chat_val_batches(split, batch_size, pad_id=pad_id, max_batches=max_batches, device=device)
    if progress:
        batches = validation_bar(batches, len(split.lengths), batch_size, max_batches)
    return score_batches(model, batches, token_bytes, device=device, amp=amp, ctx=ctx, charge_zero_byte=True)


def held_out_rows(split: Sized, count: int) -> list[int]:
    """``count`` rows (held-out conversations) spread evenly over ``split`` (all of them when it has fewer)."""
    return sorted({round(i * (len(split) - 1) / max(count - 1, 1)) for i in range(count)})


def held_out_prompts(model: Any, split: ChatSplit, count: int) -> list[list[int]]:
    """The first-reply prompts of ``held_out_rows``, those that leave the window room for a reply."""
    return [p for p in map(split.first_reply_prompt, held_out_rows(split, count)) if len(p) < model.config.block_size]


def held_out_replies(
    model: Any, split: ChatSplit, special: ChatTokenIds, *, count: int = ENDING_REPLIES,
    max_new_tokens: int = ENDING_MAX_TOKENS, temperature: float = SamplingSettings.temperature,
    seed: int = ENDING_SEED, token_bytes: Any = None,
) -> list[Finish]:
    """Replies to the first user turn of ``count`` held-out conversations, decoded together as
    ``generate.py --chat`` replies at ``temperature`` (reply i seeded ``seed`` + i). ``token_bytes``
    (the engine's byte table) fills each finish's text; without it only the ids are decoded."""
    prompts = held_out_prompts(model, split, count)
    if not prompts:
        return []
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=temperature,
                                top_p=SamplingSettings.top_p if temperature else None, seed=seed,
                                suppress_ids=special.suppress_ids)
    with eval_mode(model):
        return decode(model, prompts, settings, token_bytes=token_bytes, end_ids=special.reply_end_ids, slide=False)


def ended_share(finishes: list[Finish], special: ChatTokenIds) -> float:
    """The share of ``finishes`` whose reply ends its turn with <|end|> (NaN when there are none)."""
    if not finishes:
        return float("nan")
    return sum(bool(f.token_ids) and f.token_ids[-1] == special.end for f in finishes) / len(finishes)


# The share of sampled held-out replies that end their turn, which a chat run's final evaluation measures.
ENDED_NOTE = ("{replies/ended:.1%} of {replies/sampled:.0f} sampled held-out replies end their turn with <|end|> "
              f"(at most {ENDING_MAX_TOKENS} tokens each, or the window)")


class ChatTask(Task):
    """Supervised fine-tuning on conversations: the loss is the assistant's replies alone."""

    sample_prompt = None

    def __init__(self, prepared: Any, device: torch.device) -> None:
        super().__init__(prepared, device)
        self.words = Words(
            eval="assistant loss {loss:.4f} nats/token, {bpb:.4f} bits/byte of assistant text",
            final="{bpb:.4f} bits/byte of assistant text, <|end|> charged ({loss:.4f} nats/token)", note=ENDED_NOTE,
            batches="chat batches: {padding:.1%} of computed tokens are padding",
            epochs=f"the {len(prepared.train):,} training conversations: a model learns so few by heart and its "
            "held-out loss rises; the run keeps the weights that validated best, but more conversations (or a smaller "
            "budget) train a better model")

    def batches(self, batch_size: int, **placement: Any) -> Batches:
        return ChatBatches(self.prepared.train, batch_size, pad_id=self.prepared.eot_id, **placement)

    def accumulate(self, model, batches, micro_steps, *, amp, sync, ctx, stop):
        # The step's target count is needed before the first backward, so its batches are drawn first.
        micro_batches = [batches.next() for _ in range(micro_steps)]
        loss = accumulate_chat_gradients(model, micro_batches, amp=amp, sync=sync, ctx=ctx)
        return loss, sum(x.numel() for x, _ in micro_batches) * ctx.world_size

    def evaluate(self, model, **shared):
        return evaluate_chat(model, self.prepared.val, self.token_bytes, pad_id=self.prepared.eot_id, **shared)

    def samples(self, model, settings):
        # (prompt, reply) for CHAT_SAMPLES held-out conversations, decoded together, reply i seeded
        # settings.seed + i (the engine's rule): a function of the weights alone. A reply ends at
        # <|end|> (kept) or where the window is full, as a chat's does.
        prompts = held_out_prompts(model, self.prepared.val, CHAT_SAMPLES)
        if not prompts:
            return []
        with eval_mode(model):
            finishes = decode(model, prompts, settings, end_ids=[self.tokenizer.token_to_id("<|end|>")], slide=False)
        return [(self.tokenizer.decode(prompt, skip_special_tokens=False),
                 self.tokenizer.decode(list(finish.token_ids), skip_special_tokens=False))
                for prompt, finish in zip(prompts, finishes)]

    def steps_per_epoch(self, rows_per_step):
        return len(self.prepared.train) / rows_per_step

    def final_metrics(self, model):
        special = ChatTokenIds.of(self.tokenizer)
        finishes = held_out_replies(model, self.prepared.val, special)
        if not finishes:
            return {}
        return {"replies/ended": ended_share(finishes, special), "replies/sampled": float(len(finishes))}

    def train_fields(self, batches):
        return {"padding_fraction": batches.padding_fraction}

def build(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool, device: torch.device,
          adapters: Adapters, resume: bool = False) -> ChatTask:
    """The conversations of ``config.data``, rendered with the parent run's tokenizer."""
    prepared = prepare_chat_data(config.data, parent_tokenizer(config, tokenizer_file), config.model.block_size,
                                 progress=progress, is_main=is_main)
    return ChatTask(fitted(prepared, config), device)
