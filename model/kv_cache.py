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
    only ever reads ``[0, pos + T)``, so ``reset()`` needs no zeroing: old entries beyond the
    new ``pos`` are overwritten before they can be read.
    """

    def __init__(
        self,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (n_layer, batch_size, n_kv_head, max_len, head_dim)
        # One allocation per kind; cache.k[i] is layer i's (B, n_kv_head, max_len, head_dim) view.
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
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

    def advance(self, n_new: int) -> None:
        """Mark ``n_new`` positions as written; the model calls this after its last layer."""
        self.pos += n_new
