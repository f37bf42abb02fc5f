"""Validation loss (nats per token and bits per byte) and a text sample from the KV-cache path."""

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from common.errors import UserError
from data.batches.text import iter_val_batches
from data.metrics import bits_per_byte, target_nats_and_bytes
from data.tokenizer import eot_id, prompt_ids
from inference.engine import decode
from inference.sampling import SamplingSettings
from model.gpt import eval_mode
from training.distributed import DistContext, all_reduce_sum, is_sharded


@dataclass
class EvalResult:
    loss: float  # mean cross-entropy, nats per target token
    bpb: float  # bits per UTF-8 byte of the target text: comparable across tokenizers
    tokens: int
    bytes: int
    # What else a task measures at each evaluation, under its own names (a preference task's
    # ``rewards/accuracies``, say): the trainer logs them beside the loss.
    metrics: dict[str, float] = field(default_factory=dict)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    val_tokens: np.ndarray,
    token_bytes: torch.Tensor,
    *,
    block_size: int,
    batch_size: int,
    max_batches: int | None,
    device: torch.device,
    amp: Callable[[], ContextManager] | None = None,
    ctx: DistContext = DistContext(),
    progress: bool = False,
) -> EvalResult:
    """Score ``max_batches`` fixed validation batches (None: the whole split), as ``score_batches``;
    ``progress`` shows a progress bar."""
    batches = iter_val_batches(val_tokens, block_size, batch_size, max_batches=max_batches, device=device)
    if progress:
        windows = max(0, (len(val_tokens) - 1) // block_size)  # as iter_val_batches cuts them
        batches = validation_bar(batches, windows, batch_size, max_batches)
    result = score_batches(model, batches, token_bytes, device=device, amp=amp, ctx=ctx)
    if result.tokens == 0:
        raise UserError(
            "the validation split has no window of model.block_size + 1 tokens; "
            "lower model.block_size or give the data more validation text (data.val_fraction)"
        )
    return result


def validation_bar(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]], rows: int, batch_size: int, max_batches: int | None
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` (``rows`` sequences before ``max_batches``) behind a progress bar on stderr."""
    if max_batches is not None:
        rows = min(rows, max_batches * batch_size)
    return tqdm(
        batches, total=math.ceil(rows / batch_size), desc="full validation", unit="batch", leave=False, dynamic_ncols=True
    )


@torch.no_grad()
def score_batches(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    token_bytes: torch.Tensor,
    *,
    device: torch.device,
    amp: Callable[[], ContextManager] | None = None,
    ctx: DistContext = DistContext(),
    charge_zero_byte: bool = False,
) -> EvalResult:
    """Loss over the targets of ``batches`` that are not -1, and bits per byte of their text (zero-byte
    targets left out unless ``charge_zero_byte``, ``data.metrics``). Each process scores every
    ``world_size``-th batch and the sums are added, equal to a single-process evaluation."""
    # nats and count over every scored target (the loss); nats and UTF-8 bytes for bits per byte.
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    seen = 0
    with eval_mode(model):
        for i, (x, y) in enumerate(batches):
            seen = i + 1
            if i % ctx.world_size != ctx.rank:
                continue
            with amp() if amp is not None else contextlib.nullcontext():
                logits = model(x)
            logits = logits.float()
            sums[0] += F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum").double()
            sums[1] += (y != -1).sum()
            text_nats, text_bytes = target_nats_and_bytes(logits, y, token_bytes,
                                                          charge_zero_byte=charge_zero_byte)
            sums[2] += text_nats
            sums[3] += text_bytes
        if ctx.enabled and is_sharded(model) and ctx.rank >= seen % ctx.world_size > 0:
            # FSDP gathers weights inside every forward, from all ranks together: a rank left out
            # of the last round of batches runs a throwaway forward beside the others' last.
            model(torch.zeros(1, 1, dtype=torch.long, device=device))
    nats, tokens, text_nats, nbytes = all_reduce_sum(sums, ctx).tolist()
    return EvalResult(
        loss=nats / max(tokens, 1),
        bpb=bits_per_byte(text_nats, int(nbytes)) if nbytes > 0 else float("nan"),
        tokens=int(tokens),
        bytes=int(nbytes),
    )


def generate_sample(model: Any, tokenizer: Any, prompt: str, settings: SamplingSettings) -> str:
    """Prompt + continuation through the engine, ending where the model ends the document. The
    engine's private generator makes it a function of the weights alone (a resumed run's samples
    match) and leaves the training RNG untouched."""
    ids = prompt_ids(tokenizer, prompt)
    with eval_mode(model):
        finish, = decode(model, [ids], settings, end_ids=[eot_id(tokenizer)])
    # Special tokens are markers, not text: an empty prompt is the end-of-text token alone.
    return tokenizer.decode(ids[-finish.prompt_tokens:] + list(finish.token_ids), skip_special_tokens=True)
