"""Multi-head latent attention (MLA, as in DeepSeek-V2/V3), the second attention kind beside the
grouped-query ``CausalSelfAttention`` of ``model.gpt``; ``GPTConfig.attention`` picks one.

Each token's keys and values are compressed into one latent vector ``c = RMSNorm(x W_DKV)`` of
``kv_latent_dim`` numbers, shared by every head. Head h reads its key ``c W_UK[h]`` and its value
``c W_UV[h]``, so the model has ``n_head`` distinct key/value heads (multi-head attention's
expressiveness) while the cache stores only ``c``: ``kv_latent_dim`` numbers per token and layer,
against ``2 * n_kv_head * head_dim`` for grouped-query attention. The query may be low-rank too
(``q_latent_dim``): ``q = RMSNorm(x W_DQ) W_UQ``, else ``q = x W_Q``.

Absorbing the up-projections. For one head (dropping h), a query row q (1 x d), and the key and
value of position s, k_s = c_s W_UK and v_s = c_s W_UV, with W_UK and W_UV of shape (r x d):

    score_s = q . k_s = q (c_s W_UK)^T = (q W_UK^T) . c_s
    y       = sum_s p_s v_s = (sum_s p_s c_s) W_UV

So a head can attend in latent space: its latent query ``q W_UK^T`` (1 x r) scores the cached
latents directly, and the weighted sum of latents goes through ``W_UV`` (and then the output
projection) once, per query rather than per cached position. Per-head keys and values are never
built, and a decode step reads r numbers per cached position instead of building 2 x n_head x d.
Both lines are only re-bracketed matrix products, so the two forms are equal up to rounding. The
softmax scale stays 1/sqrt(d): the scores are the same numbers, only computed in another order.

Why this is exact here and needs a decoupled RoPE key in DeepSeek: with rotary embeddings the
query at position t and the key at s are rotated, q R_t and c_s W_UK R_s, so the score is
q R_t R_s^T W_UK^T . c_s = q R_(t-s) W_UK^T . c_s. A rotation that depends on s sits between the
query and W_UK^T, so no single latent query serves every cached position. This model adds learned
positions to the input embedding, before any projection, so nothing position-dependent sits
inside attention and the absorption holds exactly.

QK-norm (``GPTConfig.qk_norm``) breaks the absorption: the key becomes ``g * k_s / rms(k_s)``
with ``k_s = c_s W_UK``, and the division by each position's own rms(k_s) cannot move into the
query. So with QK-norm decoding takes the expanded form too: the cache stays latent-only, but every
step up-projects all cached latents of the row (2 * n_head * head_dim * kv_latent_dim
multiply-adds per cached position and layer, the work the absorbed form saves).

Which form runs when: a one-token step with a cache (decoding) uses the absorbed form (unless
QK-norm is on); every other forward (training, prefill, chunks) expands the keys and values and
runs ordinary multi-head SDPA, which is the faster of the two there (``python -m
benchmarks.attention_variants --forms``; numbers in docs/results.md). The cache (``model.kv_cache``) holds one entry, the
latent, and serves both forms alike: what it returns and its mask are those of grouped-query
attention's keys.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.kv_cache import KVCache
from model.layers import RMSNorm, causal_mask, linear


class LatentAttention(nn.Module):
    """Causal self-attention whose ``n_head`` keys and values are read from one cached latent.

    ``config`` is a ``GPTConfig`` with ``attention == "mla"``.
    """

    def __init__(self, config: Any, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.kv_latent_dim = config.kv_latent_dim
        self.q_latent_dim = config.q_latent_dim
        width = config.n_head * config.head_dim
        self.q_down_dim = width if config.q_latent_dim is None else config.q_latent_dim
        # The query (or its latent) and the key/value latent in one matmul: both read x.
        self.down = nn.Linear(config.n_embd, self.q_down_dim + config.kv_latent_dim, bias=False)
        if config.q_latent_dim is not None:
            self.q_norm = RMSNorm(config.q_latent_dim, config.norm_eps)
            self.q_up = nn.Linear(config.q_latent_dim, width, bias=False)
        self.kv_norm = RMSNorm(config.kv_latent_dim, config.norm_eps)
        # Rows [0, width) are W_UK for every head, rows [width, 2 width) are W_UV.
        self.kv_up = nn.Linear(config.kv_latent_dim, 2 * width, bias=False)
        self.proj = nn.Linear(width, config.n_embd, bias=False)
        # QK-norm, as in grouped-query attention: the query here, each key once it is expanded.
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_head_norm = RMSNorm(config.head_dim, config.norm_eps)
            self.k_head_norm = RMSNorm(config.head_dim, config.norm_eps)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, x: torch.Tensor, row_blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Project x (B, T, C) to q (B, n_head, T, d) and the latents c (B, 1, T, kv_latent_dim):
        one latent "head" that the cache stores in place of n_kv_head key and value heads."""
        B, T, _ = x.shape
        q, c = linear(self.down, x, row_blocks).split([self.q_down_dim, self.kv_latent_dim], dim=-1)
        if self.q_latent_dim is not None:
            q = linear(self.q_up, self.q_norm(q), row_blocks)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q = self.q_head_norm(q)
        return q, self.kv_norm(c).unsqueeze(1)

    def cache_entries(self) -> dict[str, tuple[int, int]]:
        """What this attention caches per token and layer, as ``KVCache`` takes it: the latent
        alone, ``n_layer x kv_latent_dim`` numbers per token in all."""
        return {"latent": (1, self.kv_latent_dim)}

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, row_blocks: bool = False,
        value_embedding: None = None,
    ) -> torch.Tensor:
        """Attend over this chunk, and over the cache's earlier positions when one is given.

        The caller (GPT) begins the cache's pass before the first layer and ends it after the
        last, so every layer writes at the same positions. ``row_blocks``: see ``model.layers.linear``.
        ``value_embedding`` is always None: the config refuses value embeddings with MLA.
        """
        assert value_embedding is None, "value embeddings are grouped-query attention's only"
        B, T, C = x.shape
        q, c = self.split_heads(x, row_blocks)
        mask = None
        if cache is not None:
            (c,), mask = cache.update(self.layer_idx, c)
        if cache is not None and T == 1 and not self.qk_norm:  # decoding: attention in latent space
            y = self.attend_absorbed(q, c, mask)
        else:
            y = self.attend_expanded(q, c, mask, row_blocks)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(linear(self.proj, y, row_blocks))

    def expand(self, c: torch.Tensor, row_blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys and values (B, n_head, S, d) from latents c (B, 1, S, r): ``c W_UK[h]``
        and ``c W_UV[h]`` for every head h, in one product (the keys then QK-normed if on)."""
        B, _, S, _ = c.shape
        kv = linear(self.kv_up, c[:, 0], row_blocks).view(B, S, 2 * self.n_head, self.head_dim).transpose(1, 2)
        k, v = kv.chunk(2, dim=1)
        return (self.k_head_norm(k) if self.qk_norm else k), v

    def per_head(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v of x (B, T, C), each (B, n_head, T, d), the keys and values expanded from the
        latents. Only for looking at the heads (``GPT.attention_weights``)."""
        q, c = self.split_heads(x)
        return (q, *self.expand(c))

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK and W_UV, each (n_head, head_dim, kv_latent_dim): views of ``kv_up``'s weight."""
        w_uk, w_uv = self.kv_up.weight.chunk(2)
        shape = (self.n_head, self.head_dim, self.kv_latent_dim)
        return w_uk.view(shape), w_uv.view(shape)

    def attend_expanded(
        self, q: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None, row_blocks: bool = False
    ) -> torch.Tensor:
        """Per-head keys and values built from the latents c (B, 1, S, r), then multi-head SDPA.
        ``mask`` None means the latents end at the newest query (plain causal, bottom-right).
        ``row_blocks`` (a batch-invariant decode step with QK-norm): see ``model.layers.linear``."""
        T, S = q.shape[2], c.shape[2]
        k, v = self.expand(c, row_blocks)
        if mask is None and T != S:
            mask = causal_mask(T, S, device=q.device)
        dropout_p = self.attn_dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)

    def attend_absorbed(self, q: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The same attention in latent space (the module docstring derives it): latent queries
        score the latents c (B, 1, S, r) directly, and the weighted latents go through W_UV.

        As in ``CausalSelfAttention._attend_token``, the heads are viewed as query positions of
        one shared key/value "head" (the latent), so every head reads c with no copy, and the
        mask (R, 1, T, S) repeats once per head. Over whole cache rows under a mask (a
        batch-invariant pass) the shapes are the same at every position and in every batch, so a
        request decodes alike alone or beside others (on the CPU when kv_latent_dim is a
        multiple of 16, for the memory-alignment reason given there for head_dim)."""
        assert not self.qk_norm, "QK-norm's per-key division cannot be absorbed; use attend_expanded"
        B, H, T, d = q.shape
        S = c.shape[2]
        w_uk, w_uv = self.up_weights()
        latent_q = torch.matmul(q, w_uk).view(B, 1, H * T, self.kv_latent_dim)
        if T > 1:  # one causal mask per head; a single query may read every latent it is given
            mask = causal_mask(T, S, device=q.device) if mask is None else mask
            mask = mask.repeat(*[1] * (mask.dim() - 2), H, 1)
        dropout_p = self.attn_dropout if self.training else 0.0
        latent_y = F.scaled_dot_product_attention(
            latent_q, c, c, attn_mask=mask, dropout_p=dropout_p, scale=1.0 / math.sqrt(d))
        return torch.matmul(latent_y.view(B, H, T, self.kv_latent_dim), w_uv.transpose(1, 2))

