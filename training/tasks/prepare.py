"""``prepare_task``: the one place that reads ``data.format``, a table from it to the builder of its task."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from training.adapters import Adapters
from training.config import Config
from training.tasks import chat, text
from training.tasks.dpo import task as dpo
from training.tasks.grpo import task as grpo
from training.tasks.task import Task

# Each builder refuses what its method cannot do, prepares its data (checked to fit the model) and
# returns the task.
BUILDERS: dict[str, Callable[..., Task]] = {"text": text.build, "chat": chat.build, "preference": dpo.build,
                                            "rl": grpo.build}


def prepare_task(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool, device: torch.device,
                 adapters: Adapters, resume: bool = False) -> Task:
    """The task ``data.format`` names, its data prepared (``tokenizer_file``: a parent run's
    tokenizer, or the run's own copy when resuming; None trains one for a text run) and checked
    to fit the model; ``adapters``: how the run's weights train (a post-training reference asks);
    ``resume``: the run continues from its checkpoint (a reference checks it is the one it began with)."""
    build = BUILDERS[config.data.format]
    return build(config, tokenizer_file, progress=progress, is_main=is_main, device=device, adapters=adapters,
                 resume=resume)
