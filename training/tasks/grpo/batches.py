"""Prompt batches for reinforcement learning.

Each epoch shuffles the training prompts by (seed, epoch) alone, so every rank agrees on the order
and a resumed run continues it exactly; rank r takes the r-th ``batch_size`` prompts of each draw
of ``batch_size x world_size``. A draw is a list of prompt indices: the task samples the
completions itself (they need the model), and keeps the sampled batch that later updates reuse.

Each draw also says how to seed its completions: completion g of the prompt at place k of the
epoch's order is sampled from ``epoch seed + k x copies + g``. So a completion's seed depends on
the prompt's place alone, not on the process that draws it nor on how the step is cut into
micro-batches, and a run on several processes samples exactly what one process would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from data.errors import DataError


@dataclass(frozen=True)
class PromptDraw:
    """This rank's share of a draw: the prompts' indices, and the seed of the first prompt's first
    completion (prompt i's completion g is sampled from ``seed + i x copies + g``)."""

    indices: list[int]
    seed: int


class PromptBatches:
    """Shuffled draws of training prompt indices, every prompt once per epoch."""

    def __init__(self, count: int, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1,
                 copies: int = 1) -> None:
        self.count, self.batch_size, self.copies = count, batch_size, copies
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.draw_size = batch_size * world_size
        if count < self.draw_size:
            raise DataError(f"the rl task has {count} training prompts, fewer than one batch of {self.draw_size}: "
                            "lower train.batch_size or raise rl.arithmetic.train_problems")
        self.epoch = 0
        self.position = 0  # draws of this epoch already taken

    def next(self) -> PromptDraw:
        """This rank's prompts of the next draw, and the seed of their completions."""
        draws = self.count // self.draw_size
        if self.position >= draws:
            self.epoch, self.position = self.epoch + 1, 0
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.count)
        start = self.position * self.draw_size + self.rank * self.batch_size
        self.position += 1
        # A stream of its own (the third word), apart from the order's.
        epoch_seed = int(np.random.default_rng([self.seed, self.epoch, 1]).integers(2**31))
        return PromptDraw(order[start:start + self.batch_size].tolist(), epoch_seed + start * self.copies)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
