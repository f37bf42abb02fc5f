"""Bits per byte: validation loss measured per byte of text, comparable across tokenizers.

Loss per token depends on how much text a token covers; dividing the summed loss by the UTF-8
bytes those tokens stand for removes that, so models with different vocabularies compare fairly.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def bits_per_byte(total_nats: float, total_bytes: int) -> float:
    """Summed loss in nats over scored targets -> bits per UTF-8 byte those targets cover."""
    if total_bytes <= 0:
        raise ValueError(f"bits_per_byte needs a positive byte count, got {total_bytes}")
    return float(total_nats) / math.log(2) / int(total_bytes)


def target_nats_and_bytes(
    logits: torch.Tensor, targets: torch.Tensor, token_bytes: torch.Tensor, *, charge_zero_byte: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed nats, summed bytes) over the scored targets, as 0-d tensors.

    `token_bytes` is `token_byte_lengths(tokenizer)` as a tensor on the logits' device. Ignored
    targets (-1) count in neither sum. Targets of zero bytes count in neither by default: in a text
    run they are the end-of-text token between documents, which is not text, and charging for it
    would tie the number to how a corpus is cut into documents. ``charge_zero_byte`` keeps their nats
    in the sum (they still add no bytes): a chat reply's ``<|end|>`` is the model's decision to stop,
    and a model that never makes it must score worse than one that does. Accumulate the two sums
    over batches (no host sync per batch), then call `bits_per_byte(nats.item(), bytes.item())`.
    """
    flat = targets.reshape(-1)
    safe = flat.clamp(min=0)
    nbytes = torch.where(flat >= 0, token_bytes[safe], torch.zeros_like(safe))
    nats = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), safe, reduction="none")
    charged = flat >= 0 if charge_zero_byte else nbytes > 0
    return (nats.double() * charged).sum(), nbytes.sum()
