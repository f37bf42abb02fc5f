"""Muon: momentum whose update is orthogonalised (Newton-Schulz) before it is applied.

Plain momentum steps along M, whose few largest singular directions dominate; Muon steps along the
nearest semi-orthogonal matrix (about U Vᵀ for M = U S Vᵀ), so every direction moves at a similar
rate. Five iterations of Keller Jordan's quintic (3.4445, -4.7750, 2.0315) approximate it with
matmuls only, pushing small singular values up fast rather than converging exactly.

torch.optim.Muon always iterates in bfloat16, far slower than the whole step on a CPU without bf16
matrix units (docs/results.md). This one iterates in bf16 on CUDA and fp32 elsewhere, and batches
all matrices of one shape. Under FSDP a slice's orthogonalised update is not a slice of the whole
one's, so each update is gathered whole and each process keeps its own rows: the step equals the
unsharded one, for one all-gather per matrix per step."""

from collections import defaultdict
from typing import Iterable

import torch
from torch.distributed.tensor import DTensor, Replicate

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(matrices: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """Approximately orthogonalise each matrix of a (..., rows, cols) stack, in bf16 on CUDA."""
    x = matrices.bfloat16() if matrices.is_cuda else matrices
    wide = x.size(-2) <= x.size(-1)
    if not wide:  # iterate on the smaller Gram matrix
        x = x.mT
    # Dividing by the Frobenius norm bounds the spectral norm by 1, inside the region where the
    # iteration is defined to map singular values toward 1.
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    stack_shape = x.shape[:-2]
    x = x.reshape(-1, *x.shape[-2:])  # baddbmm takes exactly one batch dimension
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT
        # b·G + c·G·G, then a·X + P·X, each as one fused multiply-add instead of a matmul followed
        # by separate scale and add passes, which is markedly faster on a CPU.
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a)
    x = x.reshape(*stack_shape, *x.shape[-2:])
    if not wide:
        x = x.mT
    return x.to(matrices.dtype)


class Muon(torch.optim.Optimizer):
    """Muon for 2-D weight matrices, with Nesterov momentum and decoupled weight decay. A step is
    ``lr * sqrt(max(1, rows / cols))`` times the orthogonalised momentum, as torch.optim.Muon's
    ``adjust_lr_fn="original"``, so its learning rates carry over."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 0.02,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"Muon lr must be > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muon momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"Muon weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        for group in self.param_groups:
            for p in group["params"]:
                if p.ndim != 2:
                    raise ValueError(f"Muon only updates 2-D weight matrices, got a parameter of shape {tuple(p.shape)}")

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # closure: the Optimizer signature; unused
        for group in self.param_groups:
            lr, wd, beta = group["lr"], group["weight_decay"], group["momentum"]
            # Matrices of one shape (and device and dtype) share one batched orthogonalisation.
            by_shape: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - beta)
                by_shape[(p.shape, p.device, p.dtype)].append((p, p.grad.lerp(buf, beta)))  # Nesterov
            for (shape, _, _), items in by_shape.items():
                updates = orthogonalize(torch.stack([_whole(u) for _, u in items]))
                scale = max(1.0, shape[0] / shape[1]) ** 0.5
                for (p, _), update in zip(items, updates):
                    p.mul_(1 - lr * wd)
                    p.add_(_shaped_like(update, p), alpha=-lr * scale)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """The whole matrix of a sharded (DTensor) update, gathered from every process."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _shaped_like(update: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``update`` (a whole matrix) laid out like ``p``: for a sharded ``p``, this process's rows,
    cut locally since every process holds the same whole update."""
    if not isinstance(p, DTensor):
        return update
    whole = DTensor.from_local(update, p.device_mesh, [Replicate()] * p.device_mesh.ndim, run_check=False)
    return whole.redistribute(p.device_mesh, p.placements)
