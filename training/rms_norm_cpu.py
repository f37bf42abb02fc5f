"""RMSNorm with a fused CPU backward: an optional speed-up for eager CPU training, nothing else.

``model.gpt.RMSNorm`` always calls ``F.rms_norm``. Training asks for this path explicitly with
``install_cpu_backward(model)``, which swaps each norm for a ``CPUBackwardRMSNorm`` holding the same
gain; everything else (inference, the server, the export) never meets it. The values are the same
either way; ``benchmarks/rms_norm_backward.py`` at 9e81adb compared the speed (docs/records.md)."""

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from model.gpt import RMSNorm


def install_cpu_backward(model: nn.Module) -> None:
    """Replace every ``RMSNorm`` of ``model`` by a ``CPUBackwardRMSNorm`` sharing its gain
    parameter (same names and state dict, same optimizer parameters)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is RMSNorm:
                norm = CPUBackwardRMSNorm(child.weight.shape[0], child.eps)
                norm.weight = child.weight
                setattr(parent, name, norm)


class CPUBackwardRMSNorm(RMSNorm):
    """``RMSNorm`` whose backward in eager CPU training is ``RMSNormCPUFunction``'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not use_cpu_backward(x, self.weight):
            return super().forward(x)
        if x.dtype == self.weight.dtype:
            return RMSNormCPUFunction.apply(x, self.weight, self.eps)
        # A bf16 input under bf16 autocast: the norms inside latent attention read a matmul's bf16
        # output, while the residual stream stays fp32. F.rms_norm would take an unfused path for the
        # mixed dtypes (with a warning) and compute in fp32 anyway; this computes in fp32 too, with the
        # fused backward, and hands back bf16.
        return RMSNormCPUFunction.apply(x.to(self.weight.dtype), self.weight, self.eps).to(x.dtype)


def use_cpu_backward(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Eager CPU training with fp32/fp64 gains: inference needs no backward, CUDA has a fused
    kernel, and torch.compile fuses the plain formula itself."""
    return (
        torch.is_grad_enabled()
        and (x.requires_grad or weight.requires_grad)
        and x.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.float64)
        and x.dtype in (weight.dtype, torch.bfloat16)
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

    whose second term, LayerNorm's centring, RMSNorm lacks: it is added back (docs/results.md).
    ``native_layer_norm_backward`` is a Core ATen op, PyTorch's documented and stable operator set."""

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
