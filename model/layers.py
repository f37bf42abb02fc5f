"""The two small building blocks around attention: RMSNorm and the SwiGLU feed-forward."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned per-channel gain.

    Unlike LayerNorm it neither centres nor adds a bias: cheaper, and as good in practice.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _wants_cpu_backward(x, self.weight):
            return RMSNormCPUFunction.apply(x, self.weight, self.eps)
        # The fused kernel is one op instead of five, which matters in the per-token decode loop.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def _wants_cpu_backward(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Training in eager mode on the CPU in fp32/fp64: the case RMSNormCPUFunction is for.

    Inference needs no backward, CUDA has a fused RMSNorm backward kernel, and torch.compile
    fuses the plain formula itself.
    """
    return (
        torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad)
        and x.device.type == "cpu"
        and x.dtype == weight.dtype
        and x.dtype in (torch.float32, torch.float64)
        and not torch.compiler.is_compiling()
    )


class RMSNormCPUFunction(torch.autograd.Function):
    """RMSNorm whose backward runs on LayerNorm's fused CPU kernel (same values, fewer passes).

    PyTorch has no CPU kernel for the RMSNorm backward, so autograd differentiates the handful of
    elementwise ops F.rms_norm is made of there: about fifteen passes over the activations.
    LayerNorm's backward kernel takes the row means and inverse standard deviations as inputs.
    Given means of zero and RMSNorm's ``rstd = 1/sqrt(mean(x²) + eps)``, it computes x̂ = x·rstd
    and the weight gradient sum(g·x̂) exactly as RMSNorm needs, and the input gradient

        rstd·(g·w − mean(g·w·x̂)·x̂) − rstd·mean(g·w)

    whose first term is RMSNorm's input gradient; the second is LayerNorm's centring, which
    RMSNorm does not have, so it is added back (one matrix-vector product for mean(g·w)).

    On tiny.yaml's (16, 128, 128) activations on 2 CPU cores, a forward and backward took 0.86 ms
    against 1.17 ms through autograd (LayerNorm: 0.42 ms), and a training step, with nine norms,
    got 1.6% faster (benchmarks/rms_norm_backward.py).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = x.contiguous()
        # Under bf16 autocast vecdot would run in bf16; the norm stays in x's dtype, as F.rms_norm.
        with torch.autocast("cpu", enabled=False):
            rstd = torch.linalg.vecdot(x, x).div_(x.shape[-1]).add_(eps).rsqrt_().unsqueeze(-1)
        ctx.save_for_backward(x, weight, rstd)
        return (x * rstd).mul_(weight)

    @staticmethod
    @once_differentiable  # rstd was computed outside autograd: no second derivative
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        dim = x.shape[-1]
        need_x, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_x, grad_weight, _ = torch.ops.aten.native_layer_norm_backward(
            grad.contiguous(), x, [dim], torch.zeros_like(rstd), rstd, weight, None,
            [need_x, need_weight, False],
        )
        if need_x:
            mean_gw = torch.mv(grad.reshape(-1, dim), weight).view_as(rstd).div_(dim)
            grad_x.add_(mean_gw.mul_(rstd))
        return grad_x, grad_weight, None


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
