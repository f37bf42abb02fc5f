"""Muon: momentum whose update is orthogonalised (Newton-Schulz) before it is applied.

For a weight matrix W, plain momentum steps along the momentum matrix M, whose few largest singular
directions dominate. Muon steps along the nearest semi-orthogonal matrix to M instead (roughly
U Vᵀ for M = U S Vᵀ), so every direction the gradient points along moves at a similar rate.
Five iterations of a quintic Newton-Schulz polynomial approximate U Vᵀ with matmuls only; the
coefficients (3.4445, -4.7750, 2.0315) are Keller Jordan's, chosen to push small singular values
up fast rather than to converge exactly: for a random matrix the singular values come out
between about 0.7 and 1.15.

torch.optim.Muon (torch >= 2.9) does the same mathematics, but always iterates in bfloat16. That
is right on a GPU and far slower than the whole forward and backward pass on a CPU without bf16
matrix units (docs/results.md). This version iterates in bf16 on CUDA and in fp32 elsewhere, and
orthogonalises all matrices of one shape in one batched matmul. A CPU with bf16 dot products
iterates in fp32 too: the trainer steps the optimizer outside autocast, and bf16 there would change
the update itself, which no records run has compared.

Three newer forms, each off by default (docs/records.md says how each screened):

- ``iteration="polar_express"``: the Polar Express iteration (Amsel, Chen, Goldstein and others,
  2025; the coefficients modded-nanogpt uses): a different quintic at each of the five steps, each
  the best for the range of singular values the step before leaves, so the result is closer to
  U Vᵀ in as many matmuls. The input is divided by slightly more than its norm (the published
  safety margin), because the first step's polynomial is steep and must not see a value past 1.
- ``normuon``: NorMuon (Li and others, 2025): after orthogonalisation, each output row (neuron) is
  divided by the root of a running mean of its own squared update, then the whole update is scaled
  back to the norm it had. Orthogonal updates leave the rows' sizes very uneven; this evens them
  the way Adam evens coordinates.
- ``cautious_weight_decay``: decay only the weights whose update already pulls them toward zero
  (update and weight of one sign), as in "Cautious Weight Decay" (Chen and others, 2025): decay then
  never pushes against what the gradient asks of a weight.

Under FSDP (train.parallel: fsdp) each process holds a slice of rows of every matrix, and the
orthogonalised update of a slice is not a slice of the orthogonalised matrix. So each update is
gathered whole, every process orthogonalises the same whole matrices, and each keeps its own
rows: the step equals the unsharded one, at the price of one all-gather per matrix per step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import torch
from torch.distributed.tensor import DTensor, Replicate

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# One (a, b, c) per step, as published for five steps with a safety margin of 2%.
POLAR_EXPRESS_COEFFICIENTS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
POLAR_EXPRESS_MARGIN = 1.02
ITERATIONS = ("newton_schulz", "polar_express")
NORMUON_BETA2 = 0.95  # the running mean of each row's squared update, as NorMuon's authors set it


def iteration_coefficients(iteration: str, steps: int = 5) -> tuple[list[tuple[float, float, float]], float]:
    """Each step's (a, b, c) and the factor the input's norm is multiplied by before the first."""
    if iteration == "polar_express":
        assert steps == len(POLAR_EXPRESS_COEFFICIENTS), "Polar Express is published for five steps"
        return list(POLAR_EXPRESS_COEFFICIENTS), POLAR_EXPRESS_MARGIN
    assert iteration == "newton_schulz", iteration
    return [NS_COEFFICIENTS] * steps, 1.0


def orthogonalize(
    matrices: torch.Tensor, steps: int = 5, eps: float = 1e-7, iteration: str = "newton_schulz",
) -> torch.Tensor:
    """Approximately orthogonalise each matrix of a (..., rows, cols) stack (see the module doc).

    Computed in bf16 on CUDA and in the input dtype elsewhere; returned in the input dtype.
    """
    coefficients, margin = iteration_coefficients(iteration, steps)
    x = matrices.bfloat16() if matrices.is_cuda else matrices
    wide = x.size(-2) <= x.size(-1)
    if not wide:  # iterate on the smaller Gram matrix
        x = x.mT
    # Dividing by the Frobenius norm bounds the spectral norm by 1, inside the region where the
    # iteration is defined to map singular values toward 1.
    x = x / (margin * x.norm(dim=(-2, -1), keepdim=True)).clamp(min=eps)
    stack_shape = x.shape[:-2]
    x = x.reshape(-1, *x.shape[-2:])  # baddbmm takes exactly one batch dimension
    for a, b, c in coefficients:
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
    """Muon for 2-D weight matrices, with Nesterov momentum and decoupled weight decay.

    The step for a (rows, cols) matrix is ``lr * sqrt(max(1, rows / cols))`` times the
    orthogonalised momentum, the same scaling as torch.optim.Muon's ``adjust_lr_fn="original"``,
    so its learning rates carry over. Weight decay multiplies the weights by ``1 - lr * wd`` (with
    ``cautious_weight_decay``, only where update and weight share a sign). ``iteration`` and
    ``normuon`` choose the newer forms in the module doc.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 0.02,
        momentum: float = 0.95,
        weight_decay: float = 0.0,
        *,
        iteration: str = "newton_schulz",
        normuon: bool = False,
        cautious_weight_decay: bool = False,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"Muon lr must be > 0, got {lr}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muon momentum must be in [0, 1), got {momentum}")
        if weight_decay < 0:
            raise ValueError(f"Muon weight_decay must be >= 0, got {weight_decay}")
        if iteration not in ITERATIONS:
            raise ValueError(f"Muon iteration must be one of {', '.join(ITERATIONS)}, got {iteration!r}")
        self.iteration, self.normuon, self.cautious = iteration, normuon, cautious_weight_decay
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
                updates = orthogonalize(torch.stack([_whole(u) for _, u in items]), iteration=self.iteration)
                if self.normuon:
                    updates = self._normalize_rows(updates, [p for p, _ in items])
                scale = max(1.0, shape[0] / shape[1]) ** 0.5
                for (p, _), update in zip(items, updates):
                    update = _shaped_like(update, p)
                    if self.cautious:
                        # Decay where the step already moves the weight toward zero, nowhere else.
                        p.mul_(1 - lr * wd * (update * p > 0))
                    else:
                        p.mul_(1 - lr * wd)
                    p.add_(update, alpha=-lr * scale)

    def _normalize_rows(self, updates: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """NorMuon: each row of each (rows, cols) update divided by the root of its running mean
        square (kept per parameter, one number per row), then scaled back to the update's norm."""
        row_square = updates.square().mean(dim=-1, keepdim=True)  # (n, rows, 1)
        means = []
        for p, square in zip(params, row_square):
            state = self.state[p]
            if "row_second_moment" not in state:
                state["row_second_moment"] = torch.zeros_like(square)
            state["row_second_moment"].lerp_(square, 1 - NORMUON_BETA2)
            means.append(state["row_second_moment"])
        normalized = updates * torch.stack(means).clamp(min=1e-10).rsqrt()
        norm_ratio = updates.norm(dim=(-2, -1), keepdim=True) / normalized.norm(dim=(-2, -1), keepdim=True).clamp(min=1e-10)
        return normalized * norm_ratio


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
