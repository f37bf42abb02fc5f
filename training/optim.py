"""The optimizers (AdamW, or Muon for hidden matrices with AdamW for the rest) and the LR schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from training.config import TrainConfig
from training.muon import Muon

@dataclass(frozen=True)
class ParamGroup:
    """One group of parameters, run at the schedule's rate times ``lr_scale``, so Muon and AdamW,
    whose rates live on different scales, follow the same warm-up and decay."""

    name: str  # matrices | other | value_tables
    params: list[nn.Parameter]
    optimizer: str  # muon | adamw
    weight_decay: float
    lr_scale: float


def decayed_and_not(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The parameters weight decay applies to (matrices), and the rest: decay would only fight norm
    gains and biases, and would shrink a rarely looked-up embedding row at every step while it gets
    almost no gradient (tied embeddings leave the output projection undecayed too)."""
    # Everything an embedding holds: its weight, or its frozen weight and trained rows (LoRA's
    # trainable tokens, which are rows of the embedding all the same).
    embedding_params = {
        id(param) for module in model.modules() if isinstance(module, nn.Embedding) for param in module.parameters()
    }
    decay, no_decay = [], []
    for param in model.parameters():  # parameters() yields a tied tensor once
        if not param.requires_grad:
            continue
        if param.ndim >= 2 and id(param) not in embedding_params:
            decay.append(param)
        else:
            no_decay.append(param)
    return decay, no_decay


def plan_param_groups(model: nn.Module, cfg: TrainConfig) -> list[ParamGroup]:
    """The groups ``build_optimizer`` makes, in its order, each with its learning-rate scale. Muon
    takes the hidden matrices (its update suits maps between hidden states, not embeddings or gains).
    Value-embedding tables always get their own group, so the groups depend on the model alone and a
    resume may change ``train.value_embedding_lr`` like any other rate."""
    decay, no_decay = decayed_and_not(model)
    muon = cfg.optimizer == "muon"
    groups = [ParamGroup("matrices", decay, "muon" if muon else "adamw", cfg.weight_decay,
                         cfg.muon_lr / cfg.lr if muon else 1.0)]
    tables = {id(table.weight) for table in getattr(model, "value_embs", {}).values()}
    groups.append(ParamGroup("other", [p for p in no_decay if id(p) not in tables], "adamw", 0.0, 1.0))
    if tables:
        scale = (cfg.value_embedding_lr or cfg.lr) / cfg.lr
        groups.append(ParamGroup("value_tables", [p for p in no_decay if id(p) in tables], "adamw", 0.0, scale))
    return groups


def build_optimizer(
    groups: list[ParamGroup], cfg: TrainConfig, device: torch.device
) -> torch.optim.AdamW | MuonWithAdamW:
    """The optimizer ``train.optimizer`` names over ``groups``; its ``param_groups`` are in the
    order of ``groups`` (Muon's first), which ``set_learning_rate`` relies on."""
    kinds = [group.optimizer for group in groups]
    assert kinds == sorted(kinds, key=lambda kind: kind != "muon"), kinds
    # The fused CUDA kernel updates every parameter in one launch; elsewhere the default
    # (foreach) implementation is the fast one.
    adamw = torch.optim.AdamW(
        [{"params": g.params, "weight_decay": g.weight_decay, "lr": cfg.lr * g.lr_scale}
         for g in groups if g.optimizer == "adamw"],
        lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=device.type == "cuda" or None,
    )
    muon = [g for g in groups if g.optimizer == "muon"]
    if not muon:
        return adamw
    [matrices] = muon
    return MuonWithAdamW(
        Muon(matrices.params, lr=cfg.lr * matrices.lr_scale, momentum=cfg.muon_momentum,
             weight_decay=matrices.weight_decay),
        adamw,
    )


def set_learning_rate(optimizer: torch.optim.AdamW | MuonWithAdamW, groups: list[ParamGroup], lr: float,
                      momentum: float | None = None) -> None:
    """Run every group of ``optimizer`` (built from ``groups``) at the schedule's ``lr`` times its
    scale, and Muon's groups at ``momentum`` (None: as they are)."""
    for torch_group, group in zip(optimizer.param_groups, groups, strict=True):
        torch_group["lr"] = lr * group.lr_scale
        if group.optimizer == "muon" and momentum is not None:
            torch_group["momentum"] = momentum


def load_optimizer_state(optimizer: torch.optim.AdamW | MuonWithAdamW, state: dict[str, Any]) -> None:
    """Load a saved optimizer state, also one saved before the scales moved into ``ParamGroup``:
    those states carry an ``lr_scale`` key per group, which the plan now owns, so it is dropped."""
    parts = [state] if "param_groups" in state else list(state.values())
    for part in parts:
        for group in part["param_groups"]:
            group.pop("lr_scale", None)
    optimizer.load_state_dict(state)


class MuonWithAdamW:
    """Muon for the hidden weight matrices and AdamW for everything else, stepped as one optimizer
    with the parts of ``torch.optim.Optimizer`` that the trainer uses."""

    def __init__(self, muon: Muon, adamw: torch.optim.AdamW) -> None:
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.muon.param_groups + self.adamw.param_groups

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
    """Linear warmup over ``warmup_steps``, then a decay from ``lr`` to ``min_lr``: "cosine" along a half
    cosine over the whole budget, "wsd" holding ``lr`` and falling linearly over the last
    ``decay_fraction``. The decay follows the largest fraction used of any budget (tokens folded into
    ``max_steps``), so when the clock binds the run still reaches the floor as time runs out."""

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
