"""Scores that say what a head does, from its attention probabilities.

Every function takes ``probs`` of shape (..., T, T): row i is where query position i puts its
weight over key positions 0..T-1. Leading dimensions (batch, heads) are kept, so one call scores
every head at once.
"""

from __future__ import annotations

import math

import torch


def previous_token_score(probs: torch.Tensor) -> torch.Tensor:
    """Mean of ``probs[..., i, i - 1]`` over queries i >= 1. A head near 1 copies the previous
    token's information forward, the first step of an induction circuit."""
    return probs.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def sink_score(probs: torch.Tensor) -> torch.Tensor:
    """Mean of ``probs[..., i, 0]`` over queries i >= 1: many heads park weight on the first token
    when nothing else is relevant, because softmax must put its mass somewhere."""
    return probs[..., 1:, 0].mean(-1)


def attention_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Mean over queries of the entropy of their weights, in bits: 0 is a head that looks at one
    token, log2(i + 1) a query i that spreads evenly."""
    p = probs.double()
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    return (-plogp.sum(-1) / math.log(2)).mean(-1).to(probs.dtype)


def induction_score(probs: torch.Tensor, period: int, offset: int = 0, length: int | None = None) -> torch.Tensor:
    """Mean weight on the token after the earlier occurrence, for a sequence whose positions
    ``offset .. offset + length - 1`` are repeated at ``offset + period ..`` (``length`` None: the
    whole period): query ``offset + period + j`` on key ``offset + j + 1``. A head near 1 completes
    patterns it has seen before in the context ("A B ... A -> B") whatever the tokens mean."""
    length = period if length is None else length
    _check_repeat(probs, period, offset, length)
    queries = torch.arange(length, device=probs.device) + offset + period
    keys = queries - period + 1
    return probs[..., queries, keys].mean(-1)


def copy_score(probs: torch.Tensor, period: int, offset: int, length: int) -> torch.Tensor:
    """Mean weight on the token about to be copied, for a span of ``length`` tokens at ``offset``
    written again at ``offset + period`` (a tool's result repeated as the answer): query
    ``offset + period + j - 1``, which predicts the repeat's j-th token, on key ``offset + j``."""
    _check_repeat(probs, period, offset, length)
    keys = torch.arange(length, device=probs.device) + offset
    return probs[..., keys + period - 1, keys].mean(-1)


def _check_repeat(probs: torch.Tensor, period: int, offset: int, length: int) -> None:
    T = probs.shape[-1]
    if not 1 <= length <= period or offset < 0 or offset + period + length > T:
        raise ValueError(f"a span of {length} at offset {offset} repeated {period} later does not fit in {T} positions")


def repeated_random_tokens(batch: int, period: int, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(batch, 2 * period) ids: ``period`` distinct ids drawn from ``ids``, then the same again.
    Random ids carry no meaning the model could have learned, so only a head that looks back for
    an earlier copy can attend to what came next. ``ids`` should be ids the model was trained on
    (an unseen id's embedding cannot be told from its neighbours'), and distinct, so that the token
    to copy is unambiguous."""
    if period > len(ids):
        raise ValueError(f"a repeat of period {period} needs {period} distinct ids, only {len(ids)} given")
    order = torch.rand(batch, len(ids), generator=generator).argsort(dim=1)[:, :period]
    first = ids[order]
    return torch.cat([first, first], dim=1)
