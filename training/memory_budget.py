"""Refuse a model that cannot fit before allocating it: an absurd ``model.vocab_size`` or
``n_embd`` should be one line, not a machine brought down by swapping."""

from __future__ import annotations

import torch

from common.device import device_memory_bytes
from model import GPTConfig
from training.config import ConfigError

# fp32 weights, their gradients and two optimizer moments (AdamW's; Muon keeps one, so this is
# an upper bound). Activations come on top and scale with the batch.
BYTES_PER_PARAMETER = 4 * 4


def check_model_fits(config: GPTConfig, device: torch.device) -> None:
    """Raise ConfigError when training ``config`` would need more memory than ``device`` has."""
    params = config.num_params()
    need = params * BYTES_PER_PARAMETER
    have = device_memory_bytes(device)
    if have is not None and need > have:
        raise ConfigError(
            f"the model has {params / 1e6:,.0f}M parameters and needs at least {need / 2**30:,.1f} GiB "
            f"for weights, gradients and optimizer state, more than the {have / 2**30:,.1f} GiB of "
            f"{device}; lower model.vocab_size, model.n_embd or model.n_layer"
        )
