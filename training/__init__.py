"""Training: config, loop, optimizer and schedule, checkpoints, metrics, distributed, wandb.

Names are resolved lazily so that ``import training`` (or a submodule such as
``training.distributed``) does not import torch, the model and the data pipeline as a side effect.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Config": "training.config",
    "ConfigError": "training.config",
    "load_config": "training.config",
    "config_from_dict": "training.config",
    "config_to_dict": "training.config",
    "save_config": "training.config",
    "train": "training.trainer",
    "TrainResult": "training.trainer",
    "NonFiniteLossError": "training.trainer",
    "CheckpointError": "training.checkpoint",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'training' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
