"""Batches of whole conversations for fine-tuning: each row starts at position 0, padded at the end.

y is x shifted by one, with -1 where the loss mask is off and over the padding, so only the replies
are learned; right-padding never changes the real tokens' outputs (attention is causal). Rows of
similar length share a batch: each epoch shuffles, sorts each bucket of ``_BUCKET_BATCHES`` draws by
length, cuts it into draws and shuffles those, by (seed, epoch) alone, so every rank agrees and a
resumed run continues exactly; rank r takes the r-th ``batch_size`` rows of a draw."""

from typing import Callable, Iterator

import numpy as np
import torch

from common.errors import DataError
from data.batches.text import stream_seed
from data.prepared.chat import ChatSplit

_BUCKET_BATCHES = 64


def collate(split: ChatSplit, rows: np.ndarray, pad_id: int, device: torch.device | str = "cpu",
            width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) for conversations ``rows``, padded to the longest (or to ``width``); y is -1 off the loss mask."""
    if width is None:
        width = int(split.lengths[rows].max()) - 1
    x = np.full((len(rows), width), pad_id, dtype=np.int64)
    y = np.full((len(rows), width), -1, dtype=np.int64)
    for r, i in enumerate(rows):
        ids, mask = split.conversation(int(i))
        n = len(ids) - 1
        x[r, :n] = ids[:-1]
        y[r, :n] = np.where(mask[1:], ids[1:].astype(np.int64), -1)
    return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


class ChatBatches:
    """Length-grouped training batches of conversations, every one once per epoch."""

    noun = "conversations"  # what a row of the split is, for messages
    sequences_per_row = 1  # rows of x each of them becomes

    def __init__(
        self, split: ChatSplit, batch_size: int, *, pad_id: int, seed: int, rank: int = 0, world_size: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        self.split, self.batch_size, self.pad_id = split, batch_size, pad_id
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.device = torch.device(device)
        self.draw_size = batch_size * world_size
        if len(split) < self.draw_size:
            raise DataError(
                f"the training split has {len(split)} {self.noun}, fewer than one batch of {self.draw_size}: "
                f"lower train.batch_size or add {self.noun}"
            )
        self.epoch = 0
        self.position = 0  # draws of this epoch already taken
        self._draws = self._epoch_draws(self.epoch)
        self.computed_tokens = 0  # positions run through the model, padding included
        self.padding_tokens = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position >= len(self._draws):
            self.epoch, self.position = self.epoch + 1, 0
            self._draws = self._epoch_draws(self.epoch)
        draw = self._draws[self.position]
        self.position += 1
        rows = draw[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        x, y = self._collate(rows)
        self.computed_tokens += x.numel()
        self.padding_tokens += x.numel() - self._positions(rows)
        return x, y

    def _collate(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return collate(self.split, rows, self.pad_id, self.device)

    def _positions(self, rows: np.ndarray) -> int:
        """Positions of ``rows`` that hold a real token (not padding)."""
        return int((self.split.lengths[rows] - 1).sum())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next()

    @property
    def padding_fraction(self) -> float:
        """Share of the positions computed so far (this process) that were padding."""
        return self.padding_tokens / self.computed_tokens if self.computed_tokens else 0.0

    def epoch_padding_fraction(self) -> float:
        """Share of an epoch's computed positions that are padding (epoch 0's order)."""
        computed = padded = 0
        for draw in self._epoch_draws(0):
            for r in range(self.world_size):
                rows = draw[r * self.batch_size : (r + 1) * self.batch_size]
                positions = (int(self.split.lengths[rows].max()) - 1) * len(rows) * self.sequences_per_row
                computed += positions
                padded += positions - self._positions(rows)
        return padded / computed

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._draws = self._epoch_draws(self.epoch)

    def _epoch_draws(self, epoch: int) -> list[np.ndarray]:
        generator = torch.Generator().manual_seed(stream_seed("chat-batches", self.seed, epoch))
        order = torch.randperm(len(self.split), generator=generator).numpy()
        lengths = self.split.lengths
        bucket = self.draw_size * _BUCKET_BATCHES
        draws = []
        for start in range(0, len(order), bucket):
            chunk = order[start : start + bucket]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            # Whole draws only: the few conversations left over wait for the next epoch's order.
            draws += [chunk[i : i + self.draw_size] for i in range(0, len(chunk) - self.draw_size + 1, self.draw_size)]
        shuffle = torch.randperm(len(draws), generator=generator).tolist()
        return [draws[i] for i in shuffle]


def iter_chat_val_batches(
    split: ChatSplit, batch_size: int, *, pad_id: int, max_batches: int | None = None,
    device: str | torch.device = "cpu", collate_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]] = collate,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Held-out conversations in length order (little padding), the same every call; with
    ``max_batches`` a fixed subset spread evenly over them. ``collate_rows`` makes a batch of rows
    of ``split`` (``training.tasks.dpo.batches.collate_pairs`` for reply pairs)."""
    for rows in val_rows(split.lengths, batch_size, max_batches):
        yield collate_rows(split, rows, pad_id, device)


def val_rows(lengths: np.ndarray, batch_size: int, max_batches: int | None) -> Iterator[np.ndarray]:
    """Held-out rows by ``lengths`` (little padding) in batches, the same every call; with
    ``max_batches`` a fixed subset spread evenly over them."""
    rows = np.argsort(lengths, kind="stable")
    if max_batches is not None:
        count = min(len(rows), max_batches * batch_size)
        rows = rows[np.linspace(0, len(rows) - 1, count).round().astype(np.int64)]
    for i in range(0, len(rows), batch_size):
        yield rows[i : i + batch_size]
