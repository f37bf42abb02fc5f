"""Scores that say what a head does, from its attention probabilities.

Every function takes ``probs`` of shape (..., T, T): row i is where query position i puts its
weight over key positions 0..T-1 (zero past i, by the causal mask). Leading dimensions (batch,
heads) are kept, so one call scores every head at once; average over the batch afterwards.

- previous-token score: the mean weight a token puts on the token just before it. A head near 1
  copies the previous token's information forward, the first step of an induction circuit.
- first-token (sink) score: the mean weight on position 0. Many heads park weight there when
  nothing else is relevant, because softmax must put its mass somewhere.
- entropy: the mean entropy of a query's weights, in bits. 0 is a head that looks at one token;
  log2(i + 1) is a query i that spreads evenly over everything it may see.
- induction score: on a random sequence repeated twice, the mean weight a token of the second copy
  puts on the token that followed its earlier occurrence. A head near 1 completes patterns it has
  seen before in the context ("A B ... A -> B") whatever the tokens mean.
- copy score: where a span is written a second time (a tool's result repeated as the answer), the
  mean weight the position that predicts each token of the repeat puts on that same token in the
  first copy: where a head reads what it copies. It and the induction score at the repeat's
  positions score a head on one given sequence rather than on a probe.
"""

from __future__ import annotations

import math

import torch


def previous_token_score(probs: torch.Tensor) -> torch.Tensor:
    """Mean of ``probs[..., i, i - 1]`` over queries i >= 1 (query 0 has no previous token)."""
    return probs.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def sink_score(probs: torch.Tensor) -> torch.Tensor:
    """Mean of ``probs[..., i, 0]`` over queries i >= 1 (query 0 can only read position 0)."""
    return probs[..., 1:, 0].mean(-1)


def attention_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Mean over queries of the entropy of their weights, in bits (0 log 0 counted as 0)."""
    p = probs.double()
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    return (-plogp.sum(-1) / math.log(2)).mean(-1).to(probs.dtype)


def induction_score(probs: torch.Tensor, period: int, offset: int = 0, length: int | None = None) -> torch.Tensor:
    """Mean weight on the token after the earlier occurrence, for a sequence whose positions
    ``offset .. offset + length - 1`` are repeated at ``offset + period ..`` (``length`` None: the
    whole period, the copies back to back).

    Query ``offset + period + j`` (the second copy's j-th token) is scored by its weight on key
    ``offset + j + 1``, which holds the token that followed the first copy's j-th token.
    """
    length = period if length is None else length
    _check_repeat(probs, period, offset, length)
    queries = torch.arange(length, device=probs.device) + offset + period
    keys = queries - period + 1
    return probs[..., queries, keys].mean(-1)


def copy_score(probs: torch.Tensor, period: int, offset: int, length: int) -> torch.Tensor:
    """Mean weight on the token about to be copied, for a span of ``length`` tokens at ``offset``
    written again at ``offset + period``: query ``offset + period + j - 1`` (the position that
    predicts the repeat's j-th token) is scored by its weight on key ``offset + j``, that token in
    the first copy. For j >= 1 these are the induction score's pairs one token earlier; j = 0 is
    the first token of the repeat, which no earlier token of the span announces."""
    _check_repeat(probs, period, offset, length)
    keys = torch.arange(length, device=probs.device) + offset
    return probs[..., keys + period - 1, keys].mean(-1)


def _check_repeat(probs: torch.Tensor, period: int, offset: int, length: int) -> None:
    T = probs.shape[-1]
    if not 1 <= length <= period or offset < 0 or offset + period + length > T:
        raise ValueError(f"a span of {length} at offset {offset} repeated {period} later does not fit in {T} positions")


def repeated_random_tokens(batch: int, period: int, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(batch, 2 * period) ids: ``period`` distinct ids drawn from ``ids``, then the same again.

    Random ids carry no meaning the model could have learned, so only a head that looks back
    for an earlier copy can attend to what came next: that is what the induction score measures.
    ``ids`` should be ids the model was trained on: an id it never saw has an embedding that
    training never pulled apart from the other unseen ones, and no head can find the earlier
    copy of a token it cannot tell from its neighbours. Distinct ids within a sequence make the
    token to copy unambiguous (a repeated id would have two successors).
    """
    if period > len(ids):
        raise ValueError(f"a repeat of period {period} needs {period} distinct ids, only {len(ids)} given")
    order = torch.rand(batch, len(ids), generator=generator).argsort(dim=1)[:, :period]
    first = ids[order]
    return torch.cat([first, first], dim=1)
