"""The KV cache: preallocated per-layer buffers, and how many positions each row holds.

Buffers are allocated once, for what attention stores per token (for grouped-query attention the
key/value heads only, never the repeated per-query-head copies), and written in place. Growing a
cache with ``torch.cat`` would copy the whole history at every step, which is what makes naive
decode loops quadratic in memory traffic."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


class LayerCache(Protocol):
    """What attention asks of a cache: ``update`` as ``KVCache.update`` defines it. The ONNX graph
    passes its past tensors through the same call."""

    def update(self, layer: int, *new: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]: ...


@dataclass
class _Pass:
    """Where one forward pass writes and what it reads, worked out once for all layers."""

    rows: list[int]
    new: int  # tokens per row in this pass
    select: slice | torch.Tensor  # the rows: consecutive ones as a slice (read as a view), others by id (a gather)
    end: int  # every row reads slots 0..end-1
    # Where the new entries go: (row ids (R, 1), every head, positions (R, new)); None when the rows
    # are consecutive at one length and written through the same views at end - new.
    index: tuple | None
    mask: torch.Tensor | None  # (R, 1, new, end) keys each query may read; None: plain causal attention


class KVCache:
    """``batch_size`` rows of up to ``max_len`` positions; row r holds ``lengths[r]`` of them.

    ``entries`` names what each layer stores per token, with its ``(heads, dim)``: grouped-query
    attention declares ``{"k": (n_kv_head, head_dim), "v": (n_kv_head, head_dim)}``. Entry ``name``
    is one buffer ``buffers[name]`` of shape ``(n_layer, batch_size, heads, max_len, dim)``.

    A forward pass with the cache writes each row's new chunk at that row's own length, so one
    object serves every case: a batch of equal rows (generate.py, ``--num-samples``), a prompt
    prefilled in chunks into one row of many, and one-token decode steps of rows at different
    lengths (continuous batching). The model drives it (``begin``, ``update``, ``end``); callers
    only choose rows and ``reset`` them, and no length is ever copied back by hand. Positions past a
    row's length are never read, so ``reset`` needs no zeroing.

    Latent attention declares ``{"latent": (1, latent_dim)}`` and nothing in this class changes.

    ``whole_buffers``: in a pass of at most that many tokens per row (True: one, a decode step;
    speculative decoding checks a few at once) every row reads its whole buffer under a mask, so its
    attention has the same shape at every length and beside any other rows (what batch-invariant
    decoding needs, ``inference.batch_invariant``)."""

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        max_len: int,
        entries: dict[str, tuple[int, int]],
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        whole_buffers: int = 0,
    ) -> None:
        self.buffers = {
            name: torch.zeros((n_layer, batch_size, heads, max_len, dim), device=device, dtype=dtype)
            for name, (heads, dim) in entries.items()
        }
        self.batch_size = batch_size
        self.max_len = max_len
        self.device = next(iter(self.buffers.values())).device
        # Views made once: a pass then does no per-layer indexing or per-pass arange to find them.
        self._layers = [tuple(b[layer] for b in self.buffers.values()) for layer in range(n_layer)]
        self._positions = torch.arange(max_len, device=self.device).unsqueeze(0)
        self._row_ids = torch.arange(batch_size, device=self.device).unsqueeze(1)
        # Host-side integers: checking room and planning a pass then never waits for the device.
        self.lengths = [0] * batch_size
        self.whole_buffers = whole_buffers
        self._pass: _Pass | None = None

    def nbytes(self) -> int:
        """Bytes held by all buffers together."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def reset(self, rows: Sequence[int] | None = None) -> None:
        """Forget every position of ``rows`` (default: all), e.g. to free a row or re-encode it."""
        for r in range(self.batch_size) if rows is None else rows:
            self.lengths[r] = 0

    def rewind(self, row: int, length: int) -> None:
        """Forget the positions of ``row`` from ``length`` on: what was written there is never read."""
        assert 0 <= length <= self.lengths[row], f"row {row} holds {self.lengths[row]} positions, not {length}"
        self.lengths[row] = length

    def begin(self, new: int, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Plan a pass that adds ``new`` tokens to each of ``rows`` (default: all, in order); return
        their positions, (R, new) or (1, new) when shared."""
        rows = list(range(self.batch_size)) if rows is None else list(rows)
        lengths = [self.lengths[r] for r in rows]
        assert len(set(rows)) == len(rows), f"rows must be distinct, got {rows}"
        assert max(lengths) + new <= self.max_len, f"rows {rows} at {lengths} have no room for {new} more"
        consecutive = rows == list(range(rows[0], rows[0] + len(rows)))
        select = slice(rows[0], rows[-1] + 1) if consecutive else torch.tensor(rows, device=self.device)
        whole = new <= self.whole_buffers
        if consecutive and len(set(lengths)) == 1 and not whole:
            # The common case (one row, --num-samples, a prompt's chunk): views of the buffers, no mask.
            start = lengths[0]
            self._pass = _Pass(rows, new, select, start + new, None, None)
            return self._positions[:, start:start + new]
        ids = self._row_ids[select] if consecutive else select.unsqueeze(1)
        positions = torch.tensor(lengths, device=self.device).unsqueeze(1) + self._positions[:, :new]
        end = self.max_len if whole else max(lengths) + new
        mask = (self._positions[:, :end] <= positions.unsqueeze(-1)).unsqueeze(1)
        self._pass = _Pass(rows, new, select, end, (ids, slice(None), positions), mask)
        return positions

    def update(self, layer: int, *new: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """Write this pass's entries of ``layer`` (each (R, heads, new, dim), in the declared order)
        and return what the queries read: each entry over the rows' first ``end`` slots, and a
        (R, 1, new, end) mask of the keys each query may read, or None when the entries end at the
        newest position (plain causal attention, aligned bottom-right)."""
        p = self._pass
        assert p is not None and new[0].shape[2] == p.new, "call begin() before update()"
        buffers = self._layers[layer]
        if p.index is None:
            read = [buffer[p.select].narrow(2, 0, p.end) for buffer in buffers]
            for entry, x in zip(read, new):
                entry.narrow(2, p.end - p.new, p.new).copy_(x)
            return read, None
        for buffer, x in zip(buffers, new):
            buffer[p.index] = x.transpose(1, 2)
        return [buffer.narrow(2, 0, p.end)[p.select] for buffer in buffers], p.mask

    def end(self) -> None:
        """Count the pass's tokens in each of its rows; the model calls this after its last layer."""
        p = self._pass
        for r in p.rows:
            self.lengths[r] += p.new
        self._pass = None

    def count(self, rows: Sequence[int]) -> None:
        """Count one more position in each of ``rows``: written by a ``StaticStep`` over the buffers."""
        for r in rows:
            assert self.lengths[r] < self.max_len, f"row {r} is full"
            self.lengths[r] += 1

    def read(self, row: int, start: int, end: int) -> dict[str, torch.Tensor]:
        """A copy of every entry of ``row`` at positions ``start..end-1``, each (n_layer, heads,
        end - start, dim), by entry name: what a prefix cache keeps of a prompt's positions."""
        assert 0 <= start < end <= self.lengths[row], f"row {row} holds {self.lengths[row]} positions"
        return {name: buffer[:, row, :, start:end].clone() for name, buffer in self.buffers.items()}

    def extend(self, row: int, entries: dict[str, torch.Tensor]) -> None:
        """Append ``entries`` (as ``read`` returns them) to ``row`` at its length, and count them:
        a prefix computed earlier is put back without running the model."""
        start = self.lengths[row]
        new = next(iter(entries.values())).shape[2]
        assert entries.keys() == self.buffers.keys() and start + new <= self.max_len
        for name, buffer in self.buffers.items():
            buffer[:, row, :, start:start + new] = entries[name]
        self.lengths[row] += new

    def drop(self, row: int, start: int, count: int,
             move: Callable[[dict[str, torch.Tensor], int], None] | None = None) -> None:
        """Forget ``count`` positions of ``row`` from ``start`` on: the later ones move down into
        their place, and ``move(entries, -count)`` (``GPT.move_entries``) first makes their entries
        what they would be there. How a rolling cache evicts the middle of a stream."""
        length = self.lengths[row]
        assert 0 <= start and count >= 1 and start + count <= length, f"row {row} holds {length} positions"
        later = self.read(row, start + count, length) if start + count < length else None
        self.lengths[row] = start
        if later is not None:
            if move is not None:
                move(later, -count)
            self.extend(row, later)


class StaticStep:
    """One token for every row of a cache's ``buffers`` (``KVCache.buffers``' values), row r written at
    ``slots[r]`` and reading every slot up to it under a mask: a ``LayerCache`` whose shapes never
    change with which rows decode, so a compiled step is compiled once and a CUDA graph can replay
    it. It keeps no lengths: the caller counts the rows that decoded (``KVCache.count``) and points
    the others at a slot nothing reads.

    ``window`` None: every row reads the whole buffer under its mask, so its arithmetic never
    depends on its length or its neighbours (batch invariance). An int: rows read only the first
    ``window`` slots, which must cover every decoding row's slot; a compiler can keep it symbolic, so a
    short row no longer pays for the whole buffer."""

    def __init__(self, buffers: Sequence[torch.Tensor], slots: torch.Tensor, window: int | None = None) -> None:
        self.buffers = buffers
        self.slots = slots
        self.window = window
        self.rows = torch.arange(slots.shape[0], device=slots.device)
        span = buffers[0].shape[3] if window is None else window
        self.mask = (torch.arange(span, device=slots.device) <= slots.unsqueeze(1)).view(-1, 1, 1, span)

    def update(self, layer: int, *new: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        for buffer, x in zip(self.buffers, new):
            # Every index a tensor: one index_put_ on the whole buffer, which a compiler writes in
            # place (through a view of one layer, it would copy the whole buffer at every step).
            buffer[torch.full_like(self.rows, layer), self.rows, :, self.slots] = x[:, :, 0]
        if self.window is None:
            return [buffer[layer] for buffer in self.buffers], self.mask
        return [buffer[layer, :, :, :self.window] for buffer in self.buffers], self.mask
