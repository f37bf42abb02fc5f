"""Grouped-query attention: ``n_head`` query heads share ``n_kv_head`` key/value heads (query head h
reads key/value head ``h // (n_head // n_kv_head)``); 1 key/value head is multi-query attention,
``n_head`` of them multi-head attention. ``model.mla`` holds the other attention kind, with the
same interface, so the two can be read side by side.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.kv_cache import KVCache
from model.layers import RMSNorm, causal_mask, linear


# enable_gqa arrived in torch 2.5 and the project still admits 2.4. A plain constant rather than
# a function call, so torch.compile sees a fixed branch.
SDPA_HAS_GQA = torch.__version__ >= "2.5"


class CausalSelfAttention(nn.Module):
    """Causal self-attention with ``n_head`` query heads sharing ``n_kv_head`` K/V heads."""

    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        # Q, K and V in one matmul: fewer kernel launches per decode step.
        qkv_dim = (config.n_head + 2 * config.n_kv_head) * config.head_dim
        self.qkv = nn.Linear(config.n_embd, qkv_dim, bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        # QK-norm: every head's query and key scaled to unit RMS, then by one learned gain per
        # channel, so the scores' size is learned rather than left to the weights' growth.
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_head_norm = RMSNorm(config.head_dim, config.norm_eps)
            self.k_head_norm = RMSNorm(config.head_dim, config.norm_eps)
        if layer_idx in config.value_embedding_layers:
            # Value embeddings (nanochat): the values get the token's own embedding under a gate
            # 2·sigmoid(x W) per key/value head, read from the layer's input.
            self.value_gate = nn.Linear(config.n_embd, config.n_kv_head, bias=False)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(
        self, x: torch.Tensor, row_blocks: bool = False, value_embedding: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project x (B, T, C) to q (B, n_head, T, d) and k, v (B, n_kv_head, T, d); a layer with
        value embeddings mixes ``value_embedding`` (B, T, n_kv_head·d, from ``GPT.value_embedding``)
        into v."""
        B, T, _ = x.shape
        d = self.head_dim
        sizes = [self.n_head * d, self.n_kv_head * d, self.n_kv_head * d]
        q, k, v = linear(self.qkv, x, row_blocks).split(sizes, dim=-1)
        if value_embedding is not None:
            gate = 2 * torch.sigmoid(linear(self.value_gate, x, row_blocks))  # (B, T, n_kv_head)
            v = v + (gate.unsqueeze(-1) * value_embedding.view(B, T, self.n_kv_head, d)).view(B, T, -1)
        q = q.view(B, T, self.n_head, d).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, d).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, d).transpose(1, 2)
        if self.qk_norm:  # before the cache: it stores the keys as the scores read them
            q, k = self.q_head_norm(q), self.k_head_norm(k)
        return q, k, v

    def per_head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of x (B, T, C), each (B, n_head, T, d): every query head beside the key/value
        head it reads. Only for looking at the heads (``GPT.attention_weights``): the forward pass
        never copies the shared key/value heads."""
        q, k, v = self.split_heads(x)
        group = self.n_head // self.n_kv_head
        return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def cache_entries(self) -> dict[str, tuple[int, int]]:
        """What this attention caches per token and layer, as ``KVCache`` takes it: K and V of the
        key/value heads only."""
        return {"k": (self.n_kv_head, self.head_dim), "v": (self.n_kv_head, self.head_dim)}

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, row_blocks: bool = False,
        value_embedding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attend over this chunk, and over the cache's earlier positions when one is given.

        The caller (GPT) begins the cache's pass before the first layer and ends it after the
        last, so every layer writes at the same positions. ``row_blocks``: see ``linear``;
        ``value_embedding``: see ``split_heads``.
        """
        B, T, C = x.shape
        q, k, v = self.split_heads(x, row_blocks, value_embedding)
        mask = None
        if cache is not None:
            (k, v), mask = cache.update(self.layer_idx, k, v)
        y = self._attend(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(linear(self.proj, y, row_blocks))

    def _attend_token(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """One new token per row against keys ``k, v``; ``mask`` (R, 1, 1, S), when given, hides
        the slots of each row's K/V buffer it may not read. With whole buffers under a mask (a
        batch-invariant pass) the shapes are the same at every position and in every batch, so
        a row's arithmetic never depends on how far it is or on which rows decode beside it.
        (On the CPU this also needs every row of q, k and v to start 64 bytes apart from the
        others, which holds when head_dim is a multiple of 16: the kernels' summation order
        depends on where a row starts in memory.)

        Viewing the group's query heads as its query positions lets the group share its K/V
        head with no copy, on any backend and torch version; for one query it is also faster
        than ``enable_gqa``."""
        B, H, _, d = q.shape
        grouped = q.view(B, self.n_kv_head, H // self.n_kv_head, d)
        dropout_p = self.attn_dropout if self.training else 0.0
        return F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask, dropout_p=dropout_p).view(B, H, 1, d)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Causal attention of q over k, v; ``mask`` None means the keys end at the newest query."""
        B, H, T, d = q.shape
        S = k.shape[2]
        dropout_p = self.attn_dropout if self.training else 0.0
        if T == 1:  # the newest token may read every key the mask allows
            return self._attend_token(q, k, v, mask)
        # A whole sequence (T == S) is plain causal; a chunk on top of a filled cache needs
        # the bottom-right mask, which is_causal=True would get wrong.
        if mask is None and T != S:
            mask = causal_mask(T, S, device=q.device)
        options = dict(attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)
        if H != self.n_kv_head:
            if SDPA_HAS_GQA:
                options["enable_gqa"] = True
            else:  # torch < 2.5: the kernel cannot broadcast K/V heads, so repeat them
                group = H // self.n_kv_head
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, **options)
