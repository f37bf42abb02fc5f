"""From a corpus to what training reads: tokenizer, token files, batches and bits per byte.

    cfg = DataConfig(source="shakespeare", vocab_size=2048)
    data = prepare_data(cfg)                       # cached; only the main process builds
    batches = TrainBatches(data.train_tokens(), block_size, batch_size, seed=1, rank=rank)
    x, y = batches.next()

`datasets` is imported only when a corpus is actually read, and torch only when batches or
metrics are first used, so preparing data or loading a tokenizer starts in a fraction of a second.
"""

from __future__ import annotations

import importlib
from typing import Any

from data.config import DataConfig, FilesSourceConfig, HubSourceConfig
from data.errors import DataError
from data.prepare import PreparedData, prepare_data
from data.tokenizer import EOT, load_tokenizer, token_byte_lengths

# Names whose modules import torch (seconds on a busy machine): loaded on first access.
_NEEDS_TORCH = {
    "TrainBatches": "data.batches",
    "EpochBatches": "data.batches",
    "train_batches": "data.batches",
    "iter_val_batches": "data.batches",
    "bits_per_byte": "data.metrics",
    "target_nats_and_bytes": "data.metrics",
}

__all__ = [
    "DataConfig",
    "HubSourceConfig",
    "FilesSourceConfig",
    "DataError",
    "prepare_data",
    "PreparedData",
    "load_tokenizer",
    "token_byte_lengths",
    "EOT",
    *_NEEDS_TORCH,
]


def __getattr__(name: str) -> Any:
    if name in _NEEDS_TORCH:
        return getattr(importlib.import_module(_NEEDS_TORCH[name]), name)
    raise AttributeError(f"module 'data' has no attribute {name!r}")
