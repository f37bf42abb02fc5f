"""``prepare_task``: the one place that reads ``data.format``, a table from it to the builder of its task."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from training.adapters import Adapters
    from training.config import Config
    from training.tasks.task import Task

# Each format's task module, imported only when a run asks for it. Its ``build`` refuses what its
# method cannot do, prepares its data (checked to fit the model) and returns the task.
TASKS = {"text": "training.tasks.text", "chat": "training.tasks.chat", "preference": "training.tasks.dpo.task",
         "rl": "training.tasks.grpo.task"}


def prepare_task(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool, device: torch.device,
                 adapters: Adapters, resume: bool = False) -> Task:
    """The task ``data.format`` names, its data prepared (``tokenizer_file``: a parent run's
    tokenizer, or the run's own copy when resuming; None trains one) and checked to fit the model."""
    build = importlib.import_module(TASKS[config.data.format]).build
    return build(config, tokenizer_file, progress=progress, is_main=is_main, device=device, adapters=adapters,
                 resume=resume)
