"""Bits per byte: validation loss measured per byte of text, comparable across tokenizers.

Loss per token depends on how much text a token covers; dividing the summed loss by the UTF-8
bytes those tokens stand for removes that, so models with different vocabularies compare fairly."""

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
    """(summed nats, summed bytes) over the scored targets (not -1), as 0-d tensors to accumulate
    without a host sync; `token_bytes` is `token_byte_lengths(tokenizer)` on the logits' device.
    Zero-byte targets count in neither sum by default: a text run's end-of-text is not text, and
    charging it would tie the number to how a corpus is cut. ``charge_zero_byte`` keeps their nats: a
    chat reply's ``<|end|>`` is the model's decision to stop, and never making it must score worse."""
    flat = targets.reshape(-1)
    safe = flat.clamp(min=0)
    nbytes = torch.where(flat >= 0, token_bytes[safe], torch.zeros_like(safe))
    nats = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), safe, reduction="none")
    charged = flat >= 0 if charge_zero_byte else nbytes > 0
    return (nats.double() * charged).sum(), nbytes.sum()
