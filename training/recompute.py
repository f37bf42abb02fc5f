"""Activation checkpointing (``train.activation_checkpointing``): each block keeps only its input
for the backward pass and recomputes the rest there, trading about a third more compute for the
activations of every layer but the one being differentiated."""

import functools
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def checkpoint_blocks(model: nn.Module) -> None:
    """Make every block of ``model`` recompute its activations in the backward pass, replacing its
    ``forward`` rather than the module, so names, FSDP's hooks and attention's hooks stay."""
    for block in model.blocks:
        block.forward = functools.partial(_recomputed, block.forward)


def _recomputed(forward: Any, *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():  # evaluation and decoding keep nothing for a backward anyway
        return forward(*args, **kwargs)
    # Non-reentrant: works with inputs that need no gradient and with keyword arguments.
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)
