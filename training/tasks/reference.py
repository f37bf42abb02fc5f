"""The frozen reference a post-training loss measures the policy against: DPO's implicit rewards and
GRPO's KL penalty. It is the ``train.init_from`` run, held as its own frozen copy, or, for a LoRA
run, the policy itself with its adapters off (its frozen weights are the parent's), so no second
copy of the weights is held."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from model import GPT
from model.gpt import eval_mode
from training.adapters import Adapters
from training.config import Config
from training.init_from import load_parent_weights


class Reference(Protocol):
    def logits(self, policy: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The reference's logits for ``x``, without gradients (``policy``: the model being trained)."""


class FrozenReference:
    """The reference as its own model: the ``init_from`` weights, in eval mode, never trained."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model.eval().requires_grad_(False)

    @torch.no_grad()
    def logits(self, policy: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class AdaptersOffReference:
    """A LoRA run's reference: the policy with its adapters off, in eval mode for the pass."""

    def __init__(self, adapters: Adapters) -> None:
        self.adapters = adapters

    @torch.no_grad()
    def logits(self, policy: nn.Module, x: torch.Tensor) -> torch.Tensor:
        with eval_mode(policy), self.adapters.base(policy):
            return policy(x)


def reference_for(config: Config, adapters: Adapters, device: torch.device) -> Reference:
    """The reference of a run that fine-tunes ``train.init_from``: the policy with its adapters off
    where they hold the parent's weights (LoRA), otherwise a frozen copy of those weights."""
    if adapters.holds_base:
        return AdaptersOffReference(adapters)
    model = GPT(config.model)
    load_parent_weights(model, config.parent)
    return FrozenReference(model.to(device))
