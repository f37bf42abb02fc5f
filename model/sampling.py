"""Turning next-token logits into a token: repetition penalty, temperature, top-k, top-p.

Cached and uncached generation both call ``sample_next_token``, so equal logits and equal generator
states give equal tokens. Every sampled row consumes exactly one uniform draw, whatever its
logits, so a row's random stream never depends on what the model predicted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

Generators = torch.Generator | Sequence[torch.Generator] | None


def check_sampling_args(
    temperature: float, top_k: int | None, top_p: float | None, repetition_penalty: float
) -> None:
    """Raise ValueError naming the first bad sampling setting."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None (no limit), got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] or None (no limit), got {top_p!r}")
    if not (isinstance(repetition_penalty, (int, float)) and math.isfinite(repetition_penalty)
            and repetition_penalty > 0):
        raise ValueError(f"repetition_penalty must be a finite number > 0 (1.0 = off), "
                         f"got {repetition_penalty!r}")


def apply_repetition_penalty(logits: torch.Tensor, prev_tokens: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty on every token id present in ``prev_tokens`` (B, L) of its row.

    A positive logit is divided by ``penalty`` and a negative one multiplied, so with
    penalty > 1 a seen token always becomes less likely, whatever the sign of its logit.
    Each id is penalised once however often it occurs. Returns a new tensor.
    """
    if penalty == 1.0 or prev_tokens.numel() == 0:
        return logits
    seen = logits.gather(-1, prev_tokens)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    # Repeated ids scatter the same value, so the result does not depend on write order.
    return logits.scatter(-1, prev_tokens, seen)


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k, then outside the top-p nucleus.

    top-k keeps exactly k ids per row (ties at the k-th value broken by ``torch.topk``).
    top-p keeps the smallest prefix of ids by descending probability whose mass is >= p
    (ties in probability ordered by id), and always at least the most likely id.
    """
    if top_k is not None and top_k < logits.size(-1):
        values, indices = logits.topk(top_k, dim=-1)
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, indices, values)
    if top_p is not None and top_p < 1.0:
        sorted_probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True, stable=True)
        # Mass strictly before each id: an id is needed while the ids above it hold < p.
        mass_before = F.pad(sorted_probs.cumsum(dim=-1)[..., :-1], (1, 0))
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    prev_tokens: torch.Tensor | None = None,
    generator: Generators = None,
) -> torch.Tensor:
    """Pick one token id per row from ``logits`` (B, vocab); returns a LongTensor (B,).

    temperature 0 is greedy: the argmax after the repetition penalty, consuming no randomness.
    Otherwise each row draws one uniform u and takes the id where the cumulative probability
    (in id order) first exceeds u. ``generator`` may be one generator shared by the rows in
    order, or one generator per row (row i then consumes only generator i).
    """
    check_sampling_args(temperature, top_k, top_p, repetition_penalty)
    logits = logits.float()
    if prev_tokens is not None:
        logits = apply_repetition_penalty(logits, prev_tokens, repetition_penalty)
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits / temperature, top_k, top_p), dim=-1)
    u = uniform_per_row(logits.shape[0], generator, logits.device)
    # Id order rather than sorted order: a tiny change in the logits then moves the
    # boundaries between ids a tiny amount, instead of reordering near-tied ids.
    cdf = probs.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, u.unsqueeze(-1) * cdf[:, -1:], right=True).squeeze(-1)
    # u * total can round up to total itself; fall back to the last id that has probability.
    last_allowed = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(dim=-1)
    return torch.minimum(idx, last_allowed)


def uniform_per_row(batch: int, generator: Generators, device: torch.device) -> torch.Tensor:
    """One U[0, 1) draw per row, on ``device``, from the generator(s) as described above."""
    if generator is None:
        return torch.rand(batch, device=device)
    if isinstance(generator, torch.Generator):
        return torch.rand(batch, generator=generator, device=generator.device).to(device)
    generators = list(generator)
    if len(generators) != batch:
        raise ValueError(f"got {len(generators)} generators for {batch} rows; "
                         f"pass one per row or a single one")
    return torch.cat([torch.rand(1, generator=g, device=g.device) for g in generators]).to(device)
