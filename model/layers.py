"""The layers every attention kind and block share: RMSNorm, the product that can be made
batch-invariant, the SwiGLU feed-forward, and the bottom-right causal mask."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned per-channel gain.

    Unlike LayerNorm it neither centres nor adds a bias: cheaper, and as good in practice.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fused kernel is one op instead of five, which matters in the per-token decode loop.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


# A batch-invariant pass computes one-token rows through every linear layer in blocks of this many.
DECODE_ROW_BLOCK = 16


def linear(layer: nn.Linear, x: torch.Tensor, row_blocks: bool = False) -> torch.Tensor:
    """``layer(x)``; with ``row_blocks``, the rows of x in blocks of exactly ``DECODE_ROW_BLOCK``.

    A BLAS library picks its kernel, and with it the order of summation, from the matrix shape:
    a row multiplied alone and the same row among 15 others may differ in the last bits, and in
    generation a near-tie then picks another token. Padded to whole blocks, a row gets the same
    arithmetic whether it is served alone or batched with any other requests. The padding costs
    a single stream speed, so only the batch-invariant decode step (the serving engine's) asks.
    """
    if not row_blocks:
        return layer(x)
    rows = x.reshape(-1, x.shape[-1])
    padded = F.pad(rows, (0, 0, 0, -rows.shape[0] % DECODE_ROW_BLOCK))
    if padded.shape[0] == DECODE_ROW_BLOCK:
        out = F.linear(padded, layer.weight, layer.bias)
    else:
        out = torch.cat([F.linear(block, layer.weight, layer.bias) for block in padded.split(DECODE_ROW_BLOCK)])
    return out[:rows.shape[0]].view(*x.shape[:-1], -1)


class SwiGLU(nn.Module):
    """Feed-forward ``down(silu(gate(x)) * up(x))``.

    Gate and up projections are stored as one matrix so a decode step does one matmul instead of
    two; on a CPU the per-call overhead of a small matmul is comparable to its arithmetic.
    """

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, row_blocks: bool = False) -> torch.Tensor:
        gate, up = linear(self.gate_up, x, row_blocks).chunk(2, dim=-1)
        return self.dropout(linear(self.down, F.silu(gate) * up, row_blocks))


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (q_len, k_len) mask, True where attending is allowed, aligned bottom-right.

    The queries are the last ``q_len`` of ``k_len`` positions, so query i may read keys
    ``j <= k_len - q_len + i``. (SDPA's ``is_causal=True`` aligns top-left, which is only right
    when ``q_len == k_len``.)
    """
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)
    return torch.arange(k_len, device=device).unsqueeze(0) <= q_pos


def causal_attention_weights(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """The (B, H, T, T) probabilities ``softmax(q kᵀ / √d)`` of a whole sequence under the causal
    mask, for q and k of shape (B, H, T, d): the weights that scaled-dot-product attention applies
    to the values inside its fused kernel, written out so that they can be looked at
    (``GPT.attention_weights``). Masked cells are exactly 0. ``scale`` replaces the 1/√d factor
    (1.0: the raw dot products), for showing what the scale does; the model never passes it."""
    scores = q @ k.transpose(-2, -1)
    scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    T = q.shape[-2]
    return torch.softmax(scores.masked_fill(~causal_mask(T, T, device=q.device), float("-inf")), dim=-1)
