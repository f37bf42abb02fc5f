"""How a run's weights train: all of them (``Adapters``), or LoRA's adapters on a frozen model
(``training.lora.LoraAdapters``). Built once by ``training.trainer.adapters_for``; everything that
differs between the two asks it, so the trainer, checkpoint and kept weights have one path each."""

from pathlib import Path
from typing import Any, ContextManager

import torch
from torch import nn

from model.gpt import GPT


class Adapters:
    """No adapters: every weight of the model trains, and the model is what the run saves."""

    # Whether the trained model holds its own frozen starting point (LoRA: the model with its
    # adapters off), so that a post-training reference needs no second copy of the weights.
    holds_base = False

    def apply(self, model: GPT, tokenizer: Any) -> None:
        """Prepare ``model`` (its starting weights loaded) to train this way, before it is wrapped;
        ``tokenizer`` is the run's, which names the tokens any trained rows stand for."""

    def trained(self, model: GPT) -> str:
        """What trains, for the run's first line."""
        return f"{model.num_params() / 1e6:.2f}M parameters"

    def describe(self, model: GPT) -> str | None:
        """A line on how it trains, said at the start where there is more to say than ``trained``."""
        return None

    def merged(self, model: GPT) -> GPT:
        """The plain model ``model.safetensors`` holds."""
        return model

    def state_for(self, model: nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A plain model's ``weights`` as a state dict ``model`` loads to compute exactly them."""
        return weights

    def save(self, run_dir: Path, model: GPT) -> None:
        """Write this way's own files beside the weights in ``run_dir`` (none here)."""

    def report(self, model: GPT, run_dir: Path) -> tuple[str, dict[str, Any]] | None:
        """For the finished run: a line for its summary and the numbers for wandb's (None: nothing to add)."""
        return None

    def base(self, model: nn.Module) -> ContextManager[None]:
        """``model`` as its frozen starting point, for a ``with`` block; only where ``holds_base``."""
        raise NotImplementedError("a model without adapters does not hold its starting weights")
