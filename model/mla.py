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

Why this is exact here and needs a decoupled RoPE key in DeepSeek: with rotary embeddings the key
is ``R_s c_s W_UK`` with a rotation R_s that depends on the key's position, and it sits between
the query and ``W_UK``, so ``W_UK`` cannot move into the query for all s at once. This model adds
learned positions to the input embedding, before any projection, so nothing position-dependent
sits inside attention and the absorption holds exactly.

Which form runs when: a one-token step with a cache (decoding) uses the absorbed form over the
layer's whole latent buffer, masked to the positions written, as ``CausalSelfAttention`` does in
its batch-invariant path; every other forward (training, prefill, chunks) expands the keys and
values and runs ordinary multi-head SDPA, which is the faster of the two there (benchmark:
``benchmarks/attention_variants.py --forms``; numbers in docs/results.md).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.kv_cache import KVCache, RowStep


class LatentAttention(nn.Module):
    """Causal self-attention whose ``n_head`` keys and values are read from one cached latent.

    ``config`` is a ``GPTConfig`` with ``attention == "mla"``. ``linear`` and ``norm`` are the
    layer classes the rest of the model is built from (``model.gpt`` passes its batch-invariant
    linear layer and its RMSNorm), so a decode step here computes like the layers around it.
    """

    def __init__(self, config: Any, layer_idx: int, linear: type[nn.Linear] = nn.Linear,
                 norm: type[nn.Module] = nn.RMSNorm) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.kv_latent_dim = config.kv_latent_dim
        self.q_latent_dim = config.q_latent_dim
        width = config.n_head * config.head_dim
        q_down = width if config.q_latent_dim is None else config.q_latent_dim
        # The query (or its latent) and the key/value latent in one matmul: both read x.
        self.down = linear(config.n_embd, q_down + config.kv_latent_dim, bias=False)
        if config.q_latent_dim is not None:
            self.q_norm = norm(config.q_latent_dim, eps=config.norm_eps)
            self.q_up = linear(config.q_latent_dim, width, bias=False)
        self.kv_norm = norm(config.kv_latent_dim, eps=config.norm_eps)
        # Rows [0, width) are W_UK for every head, rows [width, 2 width) are W_UV.
        self.kv_up = linear(config.kv_latent_dim, 2 * width, bias=False)
        self.proj = linear(width, config.n_embd, bias=False)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Project x (B, T, C) to q (B, n_head, T, d) and the latents c (B, 1, T, kv_latent_dim):
        one latent "head" that the cache stores in place of n_kv_head key heads."""
        B, T, _ = x.shape
        q, c = self.down(x).split([self.down.out_features - self.kv_latent_dim, self.kv_latent_dim], dim=-1)
        if self.q_latent_dim is not None:
            q = self.q_up(self.q_norm(q))
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        return q, self.kv_norm(c).unsqueeze(1)

    def forward(self, x: torch.Tensor, cache: KVCache | RowStep | None = None) -> torch.Tensor:
        """Attend over this chunk, and over the cache's earlier positions when one is given.

        The cache holds latents and no values (its value width is 0, so ``c[..., :0]`` is the
        empty value written beside each latent)."""
        B, T, C = x.shape
        q, c = self.split_heads(x)
        if cache is not None and T == 1:
            latents, _, written = cache.write_token(self.layer_idx, c, c[..., :0])
            y = self.attend_absorbed(q, latents, written)
        else:
            if cache is not None:
                c, _ = cache.update(self.layer_idx, c, c[..., :0])
            S = c.shape[2]
            # A chunk on top of a filled cache needs the causal mask aligned bottom-right.
            mask = None if T == S else torch.ones(T, S, dtype=torch.bool, device=x.device).tril(S - T)
            y = self.attend_expanded(q, c, mask)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK and W_UV, each (n_head, head_dim, kv_latent_dim): views of ``kv_up``'s weight."""
        w_uk, w_uv = self.kv_up.weight.chunk(2)
        shape = (self.n_head, self.head_dim, self.kv_latent_dim)
        return w_uk.view(shape), w_uv.view(shape)

    def attend_expanded(self, q: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Per-head keys and values built from the latents c (B, 1, S, r), then multi-head SDPA;
        ``mask`` None means plain causal (the chunk is the whole sequence)."""
        B, H, T, d = q.shape
        S = c.shape[2]
        k, v = self.kv_up(c[:, 0]).view(B, S, 2 * H, d).transpose(1, 2).chunk(2, dim=1)
        dropout_p = self.attn_dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)

    def attend_absorbed(self, q: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The same attention in latent space (the module docstring derives it): latent queries
        score the latents c (B, 1, S, r) directly, and the weighted latents go through W_UV.

        As in ``CausalSelfAttention._attend_token``, the heads are viewed as query positions of
        one shared key/value "head" (the latent), so every head reads c with no copy; ``mask``
        (broadcastable to (B, 1, T, S)) then repeats once per head. In a one-token step over a
        row's whole buffer the shapes are the same at every position and batch, so a request
        decodes alike served alone or beside others (on the CPU when kv_latent_dim is a multiple
        of 16, for the same memory-alignment reason as head_dim there)."""
        B, H, T, d = q.shape
        w_uk, w_uv = self.up_weights()
        latent_q = torch.matmul(q, w_uk).view(B, 1, H * T, self.kv_latent_dim)
        if mask is None:
            mask = torch.ones(T, c.shape[2], dtype=torch.bool, device=q.device).tril(c.shape[2] - T)
        if T > 1:
            mask = mask.repeat(*[1] * (mask.dim() - 2), H, 1)
        dropout_p = self.attn_dropout if self.training else 0.0
        latent_y = F.scaled_dot_product_attention(
            latent_q, c, c, attn_mask=mask, dropout_p=dropout_p, scale=1.0 / math.sqrt(d))
        return torch.matmul(latent_y.view(B, H, T, self.kv_latent_dim), w_uv.transpose(1, 2))
