"""Grouped-query causal self-attention, plus the textbook formula the tests hold it to.

Query head h reads key/value head ``h // (n_head // n_kv_head)``. K/V are never repeated per query
head on the fast paths: SDPA's ``enable_gqa`` broadcasts them inside the kernel, and a single-token
decode step folds the query heads of a group into the query axis so the group shares one K/V head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.config import GPTConfig
from model.kv_cache import KVCache


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (q_len, k_len) mask, True where attending is allowed, aligned bottom-right.

    The queries are the last ``q_len`` of ``k_len`` positions, so query i may read keys
    ``j <= k_len - q_len + i``. (SDPA's ``is_causal=True`` aligns top-left, which is only right
    when ``q_len == k_len``.)
    """
    offset = k_len - q_len
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + offset
    return torch.arange(k_len, device=device).unsqueeze(0) <= q_pos


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(QKᵀ/√d + mask)·V with K/V heads repeated explicitly; slow and plain, for tests.

    q: (B, n_head, Tq, d); k, v: (B, n_kv_head, Tk, d); mask: bool (Tq, Tk), True = allowed.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# enable_gqa arrived in torch 2.5 and the project still admits 2.4. A plain constant rather than
# a function call, so torch.compile sees a fixed branch.
SDPA_HAS_GQA = torch.__version__ >= "2.5"


class CausalSelfAttention(nn.Module):
    """Causal self-attention with ``n_head`` query heads sharing ``n_kv_head`` K/V heads."""

    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.n_kv_head = config.n_kv_head
        self.head_dim = config.head_dim
        # Q, K and V in one matmul: fewer kernel launches per decode step.
        qkv_dim = (config.n_head + 2 * config.n_kv_head) * config.head_dim
        self.qkv = nn.Linear(config.n_embd, qkv_dim, bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project x (B, T, C) to q (B, n_head, T, d) and k, v (B, n_kv_head, T, d)."""
        B, T, _ = x.shape
        d = self.head_dim
        q, k, v = self.qkv(x).split([self.n_head * d, self.n_kv_head * d, self.n_kv_head * d], dim=-1)
        q = q.view(B, T, self.n_head, d).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, d).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, d).transpose(1, 2)
        return q, k, v

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Attend over this chunk, and over the cache's earlier positions when one is given.

        The caller (GPT.forward) checks that the chunk fits and advances ``cache.pos`` after
        the last layer, so every layer writes at the same position.
        """
        B, T, C = x.shape
        q, k, v = self.split_heads(x)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)
        y = self._attend(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, H, T, d = q.shape
        S = k.shape[2]
        dropout_p = self.attn_dropout if self.training else 0.0
        if T == 1:
            # The newest token may read every key, so no mask. Viewing the group's query heads
            # as its query positions lets the group share its K/V head with no copy, on any
            # backend and torch version; it is also faster than enable_gqa for one query.
            grouped = q.view(B, self.n_kv_head, H // self.n_kv_head, d)
            return F.scaled_dot_product_attention(grouped, k, v, dropout_p=dropout_p).view(B, H, 1, d)
        # A whole sequence (T == S) is plain causal; a chunk on top of a filled cache needs
        # the bottom-right mask, which is_causal=True would get wrong.
        mask = None if T == S else causal_mask(T, S, device=q.device)
        options = dict(attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)
        if H != self.n_kv_head:
            if SDPA_HAS_GQA:
                options["enable_gqa"] = True
            else:  # torch < 2.5: the kernel cannot broadcast K/V heads, so repeat them
                group = H // self.n_kv_head
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, **options)
