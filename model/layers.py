"""The two small building blocks around attention: RMSNorm and the SwiGLU feed-forward."""

from __future__ import annotations

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.dropout(self.down(F.silu(gate) * up))
