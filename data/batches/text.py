"""Batches training reads: sampled windows for training, fixed windows for validation.

A window is block_size + 1 consecutive tokens: x is its first block_size tokens, y the same shifted
by one. Windows are gathered in one vectorised indexing of the memory-mapped tokens, never row by row."""

import hashlib
from typing import Iterator

import numpy as np
import torch

from common.errors import DataError
from data.prepared.token_files import check_one_window


class _TrainWindows:
    """What both samplers share: the arguments and the gather. Subclasses choose the
    window starts (``_starts``) and say what to save for an exact resume (``state_dict``)."""

    def __init__(
        self, tokens: np.ndarray, block_size: int, batch_size: int, *, seed: int, rank: int = 0,
        world_size: int = 1, device: str | torch.device = "cpu",
    ) -> None:
        _check_sizes(block_size, batch_size)
        check_one_window("training", len(tokens), block_size)
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.device = torch.device(device)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), int64 (batch_size, block_size), on the configured device."""
        return _windows(self.tokens, self._starts(), self.block_size, self.device)

    def _starts(self) -> np.ndarray:
        raise NotImplementedError


class TrainBatches(_TrainWindows):
    """Windows starting at uniformly random tokens ("random", as nanoGPT), from a generator per
    (seed, rank) whose state is saved for an exact resume."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, **kwargs) -> None:
        super().__init__(tokens, block_size, batch_size, **kwargs)
        self.generator = torch.Generator()
        self.generator.manual_seed(stream_seed("train-batches", self.seed, self.rank))

    def _starts(self) -> np.ndarray:
        # A window starting at s needs tokens s .. s + block_size, so s <= len - block_size - 1.
        high = len(self.tokens) - self.block_size
        return torch.randint(0, high, (self.batch_size,), generator=self.generator).numpy()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator_state": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator_state"])


class EpochBatches(_TrainWindows):
    """Every back-to-back window once per epoch ("epoch"), shuffled, the grid shifted randomly. Epoch
    e's offset and order come from (seed, e) alone, so all ranks agree: rank r takes the r-th
    batch_size of each draw of world_size x batch_size windows; a partial last draw is skipped. The
    state is (epoch, position), so resuming is exact."""

    def __init__(self, tokens: np.ndarray, block_size: int, batch_size: int, **kwargs) -> None:
        super().__init__(tokens, block_size, batch_size, **kwargs)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank {self.rank} of {self.world_size}")
        self.draw_size = batch_size * self.world_size
        # The fewest windows any epoch has (its grid offset is block_size - 1).
        fewest = _grid_windows(len(tokens), block_size, offset=block_size - 1)
        if fewest < self.draw_size:
            raise DataError(
                f"the training split has {len(tokens)} tokens, fewer than one batch of "
                f"{self.draw_size} non-overlapping windows of {block_size + 1} tokens for "
                f"train.sampling=epoch: use train.sampling=random or a smaller batch or block"
            )
        self.epoch = 0
        self.position = 0  # windows of this epoch's order already drawn (by all ranks)
        self._order = self._shuffled_starts(self.epoch)

    def _starts(self) -> np.ndarray:
        if self.position + self.draw_size > len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._shuffled_starts(self.epoch)
        first = self.position + self.rank * self.batch_size
        self.position += self.draw_size
        return self._order[first : first + self.batch_size]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._shuffled_starts(self.epoch)

    def _shuffled_starts(self, epoch: int) -> np.ndarray:
        generator = torch.Generator()
        generator.manual_seed(stream_seed("train-batches", self.seed, f"epoch {epoch}"))
        offset = int(torch.randint(0, self.block_size, (1,), generator=generator))
        count = _grid_windows(len(self.tokens), self.block_size, offset=offset)
        order = torch.randperm(count, generator=generator).numpy()
        return offset + order.astype(np.int64) * self.block_size


SAMPLERS = {"random": TrainBatches, "epoch": EpochBatches}


def train_batches(sampling: str, tokens: np.ndarray, block_size: int, batch_size: int, **kwargs) -> _TrainWindows:
    """The sampler ``train.sampling`` names ("random" or "epoch"), built with the same arguments."""
    if sampling not in SAMPLERS:
        raise ValueError(f"sampling must be one of {sorted(SAMPLERS)}, got {sampling!r}")
    return SAMPLERS[sampling](tokens, block_size, batch_size, **kwargs)


def iter_val_batches(
    tokens: np.ndarray, block_size: int, batch_size: int, *, max_batches: int | None = None,
    device: str | torch.device = "cpu",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping validation windows, in order, the same every call: every window that fits
    (max_batches=None), or a fixed subset of max_batches full batches spread evenly over the array,
    so a frequent estimate sees every part of the text, not just its first documents."""
    _check_sizes(block_size, batch_size)
    check_one_window("validation", len(tokens), block_size)
    n_windows = _grid_windows(len(tokens), block_size)
    starts = np.arange(n_windows, dtype=np.int64) * block_size
    if max_batches is not None:
        if max_batches < 0:
            raise ValueError(f"max_batches must be >= 0 or None, got {max_batches}")
        count = min(n_windows, max_batches * batch_size)
        # Spacing >= 1 before rounding, so the picked windows are distinct.
        starts = starts[np.linspace(0, n_windows - 1, count).round().astype(np.int64)]
    device = torch.device(device)
    for i in range(0, len(starts), batch_size):
        yield _windows(tokens, starts[i : i + batch_size], block_size, device)


def _windows(
    tokens: np.ndarray, starts: np.ndarray, block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    # One fancy-indexing gather (B, block_size + 1) straight from the memmap, then contiguous
    # int64 copies for embedding lookups and cross-entropy targets. The copies are made in numpy
    # on purpose: torch would split these tiny copies over its OpenMP threads, which costs
    # milliseconds per batch when the cores are busy (e.g. with the training step itself).
    windows = tokens[starts[:, None] + np.arange(block_size + 1, dtype=np.int64)]
    x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1], dtype=np.int64))
    y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:], dtype=np.int64))
    if device.type == "cuda":
        # Page-locked host memory lets the copy run asynchronously with the previous step.
        x = x.pin_memory().to(device, non_blocking=True)
        y = y.pin_memory().to(device, non_blocking=True)
    elif device.type != "cpu":
        x, y = x.to(device), y.to(device)
    return x, y


def _grid_windows(n_tokens: int, block_size: int, offset: int = 0) -> int:
    """How many back-to-back windows start at offset, offset + block_size, ... and fit."""
    return max(0, (n_tokens - 1 - offset) // block_size)


def stream_seed(sampler: str, seed: int, stream: int | str) -> int:
    """A 63-bit generator seed unique to (sampler, seed, stream); hashing keeps nearby seeds unrelated."""
    digest = hashlib.blake2b(f"{sampler}\0{seed}\0{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _check_sizes(block_size: int, batch_size: int) -> None:
    if block_size < 1 or batch_size < 1:
        raise ValueError(f"block_size and batch_size must be positive, got {block_size} and {batch_size}")
