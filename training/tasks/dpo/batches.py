"""Batches of reply pairs for preference optimisation: x holds the pairs' prompt + chosen rows, then
their prompt + rejected rows in the same order, padded at the end, so one forward pass scores both
replies of every pair; y is -1 off the replies. Pairs are drawn as conversations are
(``data.batches.chat``): grouped by length, once per epoch, exactly resumable."""

import numpy as np
import torch

from data.batches.chat import ChatBatches, collate
from training.tasks.dpo.prepared import PreferenceSplit


def collate_pairs(split: PreferenceSplit, rows: np.ndarray, pad_id: int,
                  device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) for pairs ``rows``: the chosen sequences, then the rejected, padded to one width."""
    width = int(split.lengths[rows].max()) - 1
    chosen = collate(split.chosen, rows, pad_id, device, width=width)
    rejected = collate(split.rejected, rows, pad_id, device, width=width)
    return torch.cat([chosen[0], rejected[0]]), torch.cat([chosen[1], rejected[1]])


class PreferenceBatches(ChatBatches):
    """Length-grouped training batches of ``batch_size`` reply pairs (``2 * batch_size`` rows)."""

    noun = "reply pairs"
    sequences_per_row = 2

    def _collate(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return collate_pairs(self.split, rows, self.pad_id, self.device)

    def _positions(self, rows: np.ndarray) -> int:
        return int((self.split.chosen.lengths[rows] - 1).sum() + (self.split.rejected.lengths[rows] - 1).sum())

