"""What a model does with its positions: how well it predicts held-out text in windows longer than
the ones it was trained on, and how much attention each head puts on the first token.

Length extrapolation scores the same held-out tokens cut into back-to-back windows of each length,
so the numbers differ only by how much context each token sees and by the positions the model
meets."""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from analysis.roles import attention_maps, sink_score
from data.batches.text import iter_val_batches
from data.metrics import bits_per_byte, target_nats_and_bytes
from model.config import GPTConfig
from model.gpt import eval_mode


@dataclass(frozen=True)
class LengthScore:
    length: int  # tokens per evaluation window
    bpb: float | None  # bits per byte of the scored text; None where the length is not possible
    bytes: int  # UTF-8 bytes scored (0 where not possible)
    not_possible: str | None = None  # why the length cannot be evaluated, in a few words


def length_not_possible(config: GPTConfig, length: int) -> str | None:
    """Why a model of ``config`` cannot be evaluated in windows of ``length`` tokens, or None."""
    if config.positions == "learned" and length > config.block_size:
        return f"learned positions stop at {config.block_size}"
    return None


def scored_span(n_tokens: int, lengths: Sequence[int], max_windows: int) -> int:
    """The tokens every length scores: the most whole windows of the longest length (at most
    ``max_windows``) that fit in ``n_tokens`` with one left for the last target (0: none fits)."""
    longest = max(lengths)
    return min(max_windows, max(0, (n_tokens - 1) // longest)) * longest


@torch.no_grad()
def bits_per_byte_at_lengths(
    model: nn.Module, tokens: np.ndarray, token_bytes: torch.Tensor, lengths: Sequence[int], *,
    span: int, batch_size: int,
) -> list[LengthScore]:
    """Bits per byte of the first ``span`` targets of ``tokens``, cut into back-to-back windows of
    each of ``lengths`` tokens (each dividing ``span``), every window at positions 0..length-1."""
    scores = []
    for length in lengths:
        assert span > 0 and span % length == 0, "every length must divide the scored span"
        reason = length_not_possible(model.config, length)
        if reason is not None:
            scores.append(LengthScore(length, None, 0, reason))
            continue
        positions = torch.arange(length, device=token_bytes.device).unsqueeze(0)
        nats = torch.zeros((), dtype=torch.float64)
        nbytes = torch.zeros((), dtype=torch.int64)
        with eval_mode(model):
            for x, y in iter_val_batches(tokens[:span + 1], length, batch_size, device=token_bytes.device):
                logits = model.logits(model.hidden_states(x, positions))
                window_nats, window_bytes = target_nats_and_bytes(logits, y, token_bytes)
                nats += window_nats.cpu()
                nbytes += window_bytes.cpu()
        scores.append(LengthScore(length, bits_per_byte(float(nats), int(nbytes)), int(nbytes)))
    return scores


def first_token_attention(model: nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """(n_layer, n_head): each head's sink score (the mean weight a query puts on position 0)
    averaged over the (B, T) ``windows``."""
    return torch.stack([sink_score(probs).mean(0) for probs in attention_maps(model, windows)])


def even_spread_first_token(block_size: int) -> float:
    """The sink score of a head that spreads every query's weight evenly (query i gives 1/(i + 1)
    to position 0): the level a head must clear to be said to favour the first token."""
    return sum(1.0 / (i + 1) for i in range(1, block_size)) / (block_size - 1)
