"""The frozen reference a post-training loss measures the policy against: DPO's implicit rewards and
GRPO's KL penalty. It is the ``train.init_from`` run as a frozen copy, or, for a LoRA run, the policy
with its adapters off, so no second copy is held. A frozen copy is read from the parent's weights
each time the run starts, so a resumed run checks their SHA-256 (``parent.json``): against other
weights its rewards or KL would silently measure something else."""

from typing import Protocol

import torch
from torch import nn

from model.gpt import GPT, eval_mode
from training.adapters import Adapters
from rundir.files import PARENT_FILE, WEIGHTS_FILE
from rundir.record import read_parent_record
from training.config import Config
from training.init_from import InitFromError, load_parent_weights


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


def reference_for(config: Config, adapters: Adapters, device: torch.device, *, resume: bool = False) -> Reference:
    """The reference of a run that fine-tunes ``train.init_from`` (the module's docstring says which)."""
    if adapters.holds_base:
        return AdaptersOffReference(adapters)
    if resume:
        check_reference_unchanged(config)
    model = GPT(config.model)
    load_parent_weights(model, config.parent)
    return FrozenReference(model.to(device))


def check_reference_unchanged(config: Config) -> None:
    """Refuse, in one line, to resume a run whose parent's weights file differs from the one the run
    recorded when it started (a run from before the record was kept is not checked)."""
    recorded = read_parent_record(config.out_dir).get("weights_sha256")
    if not isinstance(recorded, str):
        return
    parent = config.parent
    if recorded != parent.weights_sha256:
        raise InitFromError(
            f"cannot resume {config.out_dir}: its reference, {parent.directory / WEIGHTS_FILE} (train.init_from), "
            f"changed since the run started (sha256 {recorded[:12]}... in {PARENT_FILE}, "
            f"{parent.weights_sha256[:12]}... now), and the rest of the run would measure itself against other "
            "weights; put the parent's weights back to resume, or train a new run (another run.out_dir) from the new ones"
        )
