"""Preallocated key/value cache for incremental decoding.

Buffers are allocated once, for the key/value heads only (never the repeated per-query-head
copies), and written in place at ``pos``. Growing a cache with ``torch.cat`` would copy the whole
history at every step, which is what makes naive decode loops quadratic in memory traffic.
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer K and V buffers of shape ``(batch_size, n_kv_head, max_len, head_dim)``.

    ``pos`` is the number of positions already written. A forward pass with this cache writes
    its chunk at ``[pos, pos + T)`` in every layer and then advances ``pos`` by T. Attention
    only ever uses ``[0, pos + T)`` (a ``write_token`` step reads the whole buffer but masks the
    rest), so ``reset()`` needs no zeroing: old entries beyond the new ``pos`` never count.
    """

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        *,
        value_dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        """``value_dim`` is the width of a value (``head_dim`` unless given). Latent attention
        (``model.mla``) caches one latent per token as its "key" and no value: ``value_dim=0``
        makes V an empty buffer that every write and read below handles unchanged."""
        shape = (n_layer, batch_size, n_kv_head, max_len, head_dim)
        # One allocation per kind; cache.k[i] is layer i's (B, n_kv_head, max_len, head_dim) view.
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape[:-1] + (head_dim if value_dim is None else value_dim,), device=device, dtype=dtype)
        self.pos = 0

    @property
    def n_layer(self) -> int:
        return self.k.shape[0]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def reset(self) -> None:
        """Forget every position so the cache can serve a new prompt."""
        self.pos = 0

    def nbytes(self) -> int:
        """Bytes held by the K and V buffers together."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def check_room(self, n_new: int) -> None:
        """Raise ValueError if ``n_new`` more positions do not fit; called before any write."""
        if self.pos + n_new > self.max_len:
            raise ValueError(
                f"KV cache overflow: {n_new} new token(s) at position {self.pos} need "
                f"{self.pos + n_new} slots but the cache holds {self.max_len}; reset() the cache, "
                f"or crop the context to fit (generate_tokens slides its window automatically)"
            )

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a chunk's keys/values at ``pos`` and return views of all keys/values so far."""
        end = self.pos + k.shape[2]
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def write_token(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write one new token's keys/values at ``pos``; return the layer's whole buffers and a
        (1, 1, 1, max_len) mask of the positions written so far (the new one included)."""
        self.k[layer, :, :, self.pos] = k[:, :, 0]
        self.v[layer, :, :, self.pos] = v[:, :, 0]
        written = torch.arange(self.max_len, device=self.k.device) <= self.pos
        return self.k[layer], self.v[layer], written.view(1, 1, 1, -1)

    def advance(self, n_new: int) -> None:
        """Mark ``n_new`` positions as written; the model calls this after its last layer."""
        self.pos += n_new

    @classmethod
    def over(cls, k: torch.Tensor, v: torch.Tensor, pos: int = 0) -> KVCache:
        """A cache over existing ``(n_layer, B, n_kv_head, max_len, head_dim)`` buffers (e.g. views
        of one row of a ``RowCache``), with ``pos`` positions already written."""
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.pos = k, v, pos
        return cache


class RowCache:
    """K/V buffers for ``batch_size`` independent rows, each filled to its own length.

    This is the cache of continuous batching (``serving.engine``): a row holds one request and
    starts, re-encodes and ends on its own. A row is filled through ``row(r)``, an ordinary
    ``KVCache`` over that row alone, so a prompt is encoded exactly as it would be by itself. Then
    the rows decode together, one token each per ``step(rows)``, every row at its own position.
    ``lengths[r]`` is the number of positions written in row r; setting it to 0 frees the row
    (no zeroing needed, as in ``KVCache.reset``).
    """

    def __init__(self, buffers: KVCache) -> None:
        """Rows over ``buffers`` (e.g. ``model.init_cache(max_batch)``), every row empty."""
        self.buffers = buffers
        self.lengths = [0] * buffers.batch_size

    def row(self, r: int) -> KVCache:
        """Row r as a one-row KVCache at its current length; copy ``pos`` back to ``lengths[r]``
        after writing through it."""
        return KVCache.over(self.buffers.k[:, r:r + 1], self.buffers.v[:, r:r + 1], self.lengths[r])

    def step(self, rows: list[int]) -> RowStep:
        """The cache argument for one decode token in each of ``rows`` (distinct row indices)."""
        if len(set(rows)) != len(rows):
            raise ValueError(f"rows must be distinct, got {rows}")
        return RowStep(self, rows)


class RowStep:
    """One new token for each of ``rows`` of a RowCache, each at its own position.

    Given as the cache to ``GPT.forward``, it supplies each row's position, writes each row's
    new key/value at that row's length, and masks every row's attention to its own written
    positions, so that no row reads another row's keys or stale ones.
    """

    def __init__(self, cache: RowCache, rows: list[int]) -> None:
        self.cache = cache
        self.rows = rows
        device = cache.buffers.k.device
        self._index = torch.tensor(rows, device=device)
        self._lengths = torch.tensor([cache.lengths[r] for r in rows], device=device)
        written = torch.arange(cache.buffers.max_len, device=device) <= self._lengths.unsqueeze(1)
        self._mask = written.view(len(rows), 1, 1, -1)

    def check(self, B: int, T: int, block_size: int) -> None:
        """Raise ValueError unless idx is (len(rows), 1) and every row has room for its token."""
        if T != 1 or B != len(self.rows):
            raise ValueError(f"a RowStep decodes one token for each of its {len(self.rows)} rows; "
                             f"got idx of shape ({B}, {T})")
        limit = min(block_size, self.cache.buffers.max_len)
        full = [r for r in self.rows if self.cache.lengths[r] >= limit]
        if full:
            raise ValueError(f"rows {full} already hold {limit} positions; re-encode a shorter "
                             f"window into them first (see model.generation)")

    def positions(self) -> torch.Tensor:
        """(B, 1) position of each row's new token: the row's length so far."""
        return self._lengths.unsqueeze(1)

    def write_token(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write row i's (n_kv_head, head_dim) key/value from ``k[i], v[i]`` at its length;
        return the rows' whole buffers and a (B, 1, 1, max_len) mask of their written slots."""
        k_layer, v_layer = self.cache.buffers.k[layer], self.cache.buffers.v[layer]
        k_layer[self._index, :, self._lengths] = k[:, :, 0]
        v_layer[self._index, :, self._lengths] = v[:, :, 0]
        return k_layer.index_select(0, self._index), v_layer.index_select(0, self._index), self._mask

    def advance(self, n_new: int) -> None:
        for r in self.rows:
            self.cache.lengths[r] += n_new
