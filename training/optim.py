"""The optimizers (AdamW, or Muon for hidden matrices with AdamW for the rest) and the LR schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.config import TrainConfig
from training.muon import Muon

# Where Muon's momentum starts a warm-up (train.muon_momentum_warmup), as in modded-nanogpt.
MUON_MOMENTUM_START = 0.85


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split parameters into a decayed group (matrices) and an undecayed one.

    Decay pulls weights toward zero, which regularises the linear maps but would only fight the
    scale parameters of norms and the biases; embeddings are excluded too because a row that is
    rarely looked up would be shrunk at every step while it gets almost no gradient. (With tied
    embeddings the output projection is the same tensor, so it is not decayed either.)
    """
    embedding_params = {
        id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)
    }
    decay, no_decay = [], []
    for param in model.parameters():  # parameters() yields a tied tensor once
        if not param.requires_grad:
            continue
        if param.ndim >= 2 and id(param) not in embedding_params:
            decay.append(param)
        else:
            no_decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def split_value_tables(model: nn.Module, group: dict, cfg: TrainConfig) -> list[dict]:
    """``group`` as it is, or, when the model has value-embedding tables, ``group`` without them
    plus a group of the tables at ``train.value_embedding_lr`` (its ``lr_scale``; lr when unset).

    The tables get their own group whether or not the rate differs, so the optimizer's groups
    depend on the model alone and a resume may change the rate like any other learning rate.
    """
    tables = {id(table.weight) for table in getattr(model, "value_embs", {}).values()}
    if not tables:
        return [group]
    rest = [p for p in group["params"] if id(p) not in tables]
    own = [p for p in group["params"] if id(p) in tables]
    scale = (cfg.value_embedding_lr or cfg.lr) / cfg.lr
    return [{**group, "params": rest}, {**group, "params": own, "lr_scale": scale}]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW | MuonWithAdamW:
    """The optimizer ``train.optimizer`` names, with a ``lr_scale`` in every parameter group.

    The schedule produces one learning rate; each group runs at ``lr * lr_scale``. That keeps one
    schedule for every group of Muon + AdamW, whose learning rates live on different scales.
    """
    decay, no_decay = param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return _adamw([decay, *split_value_tables(model, no_decay, cfg)], cfg, device)
    muon = Muon(decay["params"], lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay)
    muon.param_groups[0]["lr_scale"] = cfg.muon_lr / cfg.lr
    # The embedding (which is also the output head) and the norm gains are not hidden matrices:
    # Muon's orthogonalised update suits maps between hidden states, so these keep AdamW.
    return MuonWithAdamW(muon, _adamw(split_value_tables(model, no_decay, cfg), cfg, device))


def _adamw(groups: list[dict], cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    for group in groups:
        group.setdefault("lr_scale", 1.0)
    # The fused CUDA kernel updates every parameter in one launch; elsewhere the default
    # (foreach) implementation is the fast one.
    fused = device.type == "cuda" or None
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)


def muon_momentum(cfg: TrainConfig, step: int) -> float:
    """Muon's momentum at optimizer step ``step``: ``train.muon_momentum``, or during the first
    ``train.muon_momentum_warmup`` steps a linear rise to it from 0.85 (or from itself, if lower).
    Early gradients change fast, and a long momentum average would keep stepping along stale ones."""
    warmup = cfg.muon_momentum_warmup
    if step >= warmup:
        return cfg.muon_momentum
    start = min(MUON_MOMENTUM_START, cfg.muon_momentum)
    return start + (cfg.muon_momentum - start) * step / warmup


class MuonWithAdamW:
    """Muon for the hidden weight matrices and AdamW for everything else, stepped as one optimizer
    with the parts of ``torch.optim.Optimizer`` that the trainer uses."""

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.muon.param_groups + self.adamw.param_groups

    def set_momentum(self, momentum: float) -> None:
        """Muon's momentum from the next step on (AdamW's betas stay as configured)."""
        self.muon.param_groups[0]["momentum"] = momentum

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adamw.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup over ``warmup_steps``, then a decay from ``lr`` to ``min_lr``.

    ``shape`` "cosine" decays along a half cosine over the whole budget; "wsd" (warmup, stable,
    decay) holds ``lr`` and then falls linearly over the last ``decay_fraction`` of it.

    The decay follows *progress*, the largest fraction used of any budget (a token budget is
    folded into ``max_steps``). When the clock binds, progress follows the clock, so the run
    still reaches the floor as time runs out instead of stopping half-way down a step curve.
    """

    lr: float
    min_lr: float
    warmup_steps: int
    max_steps: int | None  # planned steps (after folding in max_tokens); None = time only
    max_seconds: float | None
    shape: str = "cosine"  # cosine | wsd
    decay_fraction: float = 0.4  # wsd only

    def progress(self, step: int, elapsed_s: float) -> float:
        fractions = [0.0]
        if self.max_steps is not None:
            span = self.max_steps - self.warmup_steps
            fractions.append((step - self.warmup_steps) / span if span > 0 else 1.0)
        if self.max_seconds is not None:
            fractions.append(elapsed_s / self.max_seconds)
        return min(1.0, max(fractions))

    def __call__(self, step: int, elapsed_s: float = 0.0) -> float:
        """Learning rate for optimizer step ``step`` (0-based) at ``elapsed_s`` seconds in."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        p = self.progress(step, elapsed_s)
        if self.shape == "wsd":
            # Fraction of the peak-to-floor drop still ahead: 1 while stable, then down to 0.
            remaining = min(1.0, (1.0 - p) / self.decay_fraction)
        else:
            remaining = 0.5 * (1.0 + math.cos(math.pi * p))
        return self.min_lr + (self.lr - self.min_lr) * remaining


def planned_steps(cfg: TrainConfig, tokens_per_step: int) -> int | None:
    """The step count the step and token budgets allow (None when only time is limited)."""
    limits = []
    if cfg.max_steps is not None:
        limits.append(cfg.max_steps)
    if cfg.max_tokens is not None:
        limits.append(max(1, math.ceil(cfg.max_tokens / tokens_per_step)))
    return min(limits) if limits else None


def build_schedule(cfg: TrainConfig, tokens_per_step: int) -> LRSchedule:
    return LRSchedule(
        lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
        max_steps=planned_steps(cfg, tokens_per_step),
        max_seconds=cfg.max_minutes * 60.0 if cfg.max_minutes is not None else None,
        shape=cfg.lr_schedule, decay_fraction=cfg.lr_decay_fraction,
    )
