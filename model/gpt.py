"""The GPT, from token ids to logits, built from its config (``model.config``), in one file that
reads top to bottom: the layers every block shares, the three kinds of positions (learned, rotary,
none) and the two attention kinds (grouped-query, DeepSeek's multi-head latent attention) side by
side, pre-norm RMSNorm blocks with a SwiGLU feed-forward, and the model. A decode step also reads
``model.kv_cache`` and the one decode loop, ``inference.engine``."""

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.config import GPTConfig
from model.kv_cache import KVCache, LayerCache


# -------------------------------------------------------------------------------------------------
# What every attention kind and block share.


class RMSNorm(nn.Module):
    """Unlike LayerNorm it neither centres nor adds a bias: cheaper, and as good in practice."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fused kernel is one op instead of five, which matters in the per-token decode loop.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class SwiGLU(nn.Module):
    """Feed-forward ``down(silu(gate(x)) * up(x))``, gate and up in one matrix: one matmul per decode
    step instead of two, as on a CPU a small matmul's call overhead is comparable to its arithmetic."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.dropout(self.down(F.silu(gate) * up))


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: Any) -> torch.Tensor:
    """``F.scaled_dot_product_attention``, in fp32 when CPU autocast hands it bf16: PyTorch's CPU
    attention kernels, the backward above all, run several times slower in bf16 than in fp32 at these
    sizes (docs/training.md#precision), so there attention alone computes in fp32 and hands back bf16."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **options).to(torch.bfloat16)
    return F.scaled_dot_product_attention(q, k, v, **options)


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """True where the last ``q_len`` of ``k_len`` positions may attend: aligned bottom-right, where
    SDPA's ``is_causal=True`` aligns top-left, right only when ``q_len == k_len``."""
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)
    return torch.arange(k_len, device=device).unsqueeze(0) <= q_pos


def causal_attention_weights(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """The weights SDPA applies inside its fused kernel, ``softmax(q kᵀ / √d)`` under the causal mask,
    written out to be looked at. ``scale`` replaces 1/√d, to show what the scale does."""
    scores = q @ k.transpose(-2, -1)
    scores = scores / math.sqrt(q.shape[-1]) if scale is None else scores * scale
    T = q.shape[-2]
    return torch.softmax(scores.masked_fill(~causal_mask(T, T, device=q.device), float("-inf")), dim=-1)


# -------------------------------------------------------------------------------------------------
# Positions, three kinds side by side. ``learned``: one vector per absolute position, added to the
# token embedding (``GPT.hidden_states``); attention knows nothing of positions. ``rope`` (RoFormer;
# LLaMA, Qwen, DeepSeek): each pair of numbers of a query or key head at position t turns by the angle
# t·θ_i, θ_i = rope_theta^(-2i/dim). Rotations keep lengths and R_t R_s^T = R_(t-s), so a score
# q R_t . k R_s depends on t - s alone, and nothing is added to the residual stream. ``none`` (NoPE):
# the causal mask alone tells a token what came before it. Keys are cached rotated, so a decode step
# turns only its own query and key, and a cached key moves by one more rotation (``GPT.move_entries``).


Rotation = tuple[torch.Tensor, torch.Tensor]


def rotary(positions: torch.Tensor, dim: int, theta: float) -> Rotation:
    """cos and sin, each (P, 1, T, dim) in fp32, of positions (P, T), P 1 or B: what ``rotate`` turns
    heads (B, heads, T, dim) by. Pairs are a head's two halves (i, i + dim/2), and 1 / θ^x (not θ^-x,
    which rounds otherwise in fp32), both as transformers' Llama: a Llama export turns by these angles."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    angles = positions.unsqueeze(-1).to(torch.float32) * inv_freq
    angles = torch.cat((angles, angles), dim=-1).unsqueeze(1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, rotation: Rotation) -> torch.Tensor:
    """x (B, heads, T, dim) with each pair (x_i, x_(i+dim/2)) turned by its position's angle."""
    cos, sin = rotation
    first, second = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


# -------------------------------------------------------------------------------------------------
# Grouped-query attention, and below it latent attention with the same interface, side by side.


# enable_gqa arrived in torch 2.5 (requirements admit 2.4); a constant, so torch.compile sees one branch.
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
        if layer_idx in config.value_embedding_layers:
            # Value embeddings (nanochat): the token's own embedding, gated, added to the values.
            self.value_gate = nn.Linear(config.n_embd, config.n_kv_head, bias=False)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, x: torch.Tensor, value_embedding: torch.Tensor | None = None,
                    rotation: Rotation | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, n_head, T, d) and k, v (B, n_kv_head, T, d) of x (B, T, C), q and k rotated to their
        positions with ``rotation`` (rotary positions only)."""
        B, T, _ = x.shape
        d = self.head_dim
        sizes = [self.n_head * d, self.n_kv_head * d, self.n_kv_head * d]
        q, k, v = self.qkv(x).split(sizes, dim=-1)
        if value_embedding is not None:
            gate = 2 * torch.sigmoid(self.value_gate(x))  # (B, T, n_kv_head)
            v = v + (gate.unsqueeze(-1) * value_embedding.view(B, T, self.n_kv_head, d)).view(B, T, -1)
        q = q.view(B, T, self.n_head, d).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, d).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, d).transpose(1, 2)
        if rotation is not None:
            q, k = rotate(q, rotation), rotate(k, rotation)
        return q, k, v

    def per_head(self, x: torch.Tensor, rotation: Rotation | None = None) -> tuple[torch.Tensor, ...]:
        """q, k and v, each (B, n_head, T, d), to look at the heads: the forward pass never copies
        the shared key/value heads."""
        q, k, v = self.split_heads(x, rotation=rotation)
        group = self.n_head // self.n_kv_head
        return q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    def cache_entries(self) -> dict[str, tuple[int, int]]:
        return {"k": (self.n_kv_head, self.head_dim), "v": (self.n_kv_head, self.head_dim)}

    def rotary_entry(self) -> tuple[str, slice]:
        """The cached entry, and the part of it, that rotary positions rotate: the whole key."""
        return "k", slice(None)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, value_embedding: torch.Tensor | None = None,
                rotation: Rotation | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.split_heads(x, value_embedding, rotation)
        mask = None
        if cache is not None:
            (k, v), mask = cache.update(self.layer_idx, k, v)
        y = self._attend(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))

    def _attend_token(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None) -> torch.Tensor:
        """One new token per row. Under a mask over whole K/V buffers (a batch-invariant pass) the
        shapes are the same at every length and batch, so a row's arithmetic never depends on either
        (on the CPU when head_dim is a multiple of 16, too: rows then start 64 bytes apart, and the
        kernels' summation order depends on where a row starts). The group's query heads are viewed
        as query positions of their K/V head: no copy, on any torch, faster than ``enable_gqa`` for one
        query; reshaped back, as a CUDA kernel may return them in another memory order."""
        B, H, _, d = q.shape
        grouped = q.view(B, self.n_kv_head, H // self.n_kv_head, d)
        dropout_p = self.attn_dropout if self.training else 0.0
        return sdpa(grouped, k, v, attn_mask=mask, dropout_p=dropout_p).reshape(B, H, 1, d)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
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
        return sdpa(q, k, v, **options)


# -------------------------------------------------------------------------------------------------
# Multi-head latent attention (MLA, DeepSeek-V2/V3). Each token's keys and values come from one latent
# ``c = RMSNorm(x W_DKV)`` of ``kv_latent_dim`` (r) numbers shared by every head: head h reads the key
# ``c W_UK[h]`` and the value ``c W_UV[h]``, so there are n_head distinct key/value heads while the
# cache stores only c (r numbers per token and layer, against 2·n_kv_head·head_dim for grouped-query
# attention). The query may be low-rank too: ``q = RMSNorm(x W_DQ) W_UQ`` with ``q_latent_dim``.
#
# Absorbing the up-projections. For one head, a query row q (1 x d) and position s's key and value
# k_s = c_s W_UK and v_s = c_s W_UV (W_UK and W_UV of shape r x d):
#
#     score_s = q . k_s = q (c_s W_UK)^T = (q W_UK^T) . c_s
#     y       = sum_s p_s v_s = (sum_s p_s c_s) W_UV
#
# So the latent query ``q W_UK^T`` scores the cached latents directly, and W_UV applies once per query
# rather than per cached position: no per-head key or value is built. Both lines only re-bracket
# matrix products, so the two forms are equal up to rounding, and the softmax scale stays 1/sqrt(d).
#
# Rotary positions need a decoupled key. Rotating k_s at s and q at t makes the score
# (q R_(t-s) W_UK^T) . c_s: a rotation that depends on s sits between q and W_UK^T, and no one latent
# query serves every cached position. So the latent's keys and queries carry no position; each query
# head gets ``rope_dim`` more numbers, rotated at t, and each token one shared rotary key of
# ``rope_dim`` numbers, rotated at s and cached beside the latent:
#
#     score_s = (q_nope W_UK^T) . c_s + (q_rope R_t) . (k_rope,s R_s)
#
# The first part absorbs as before, the second is a plain dot product with a cached key, and the
# values are the latent part only. Learned or no positions put nothing position-dependent inside
# attention (rope_dim 0). Decoding (one token with a cache) takes the absorbed form; training, prefill
# and chunks expand keys and values and run ordinary SDPA, the faster form there
# (``python -m benchmarks.attention_variants --forms``; numbers in docs/results.md).


class LatentAttention(nn.Module):
    """Causal self-attention whose ``n_head`` keys and values are read from one cached latent."""

    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.kv_latent_dim = config.kv_latent_dim
        self.q_latent_dim = config.q_latent_dim
        self.rope_dim = config.rope_dim  # each head's rotary part, and the shared rotary key (0: none)
        width = config.n_head * config.head_dim
        query_width = config.n_head * (config.head_dim + self.rope_dim)
        self.q_down_dim = query_width if config.q_latent_dim is None else config.q_latent_dim
        # The query (or its latent), the key/value latent and the rotary key in one matmul: all read x.
        self.down = nn.Linear(config.n_embd, self.q_down_dim + config.kv_latent_dim + self.rope_dim, bias=False)
        if config.q_latent_dim is not None:
            self.q_norm = RMSNorm(config.q_latent_dim, config.norm_eps)
            self.q_up = nn.Linear(config.q_latent_dim, query_width, bias=False)
        self.kv_norm = RMSNorm(config.kv_latent_dim, config.norm_eps)
        # Rows [0, width) are W_UK for every head, rows [width, 2 width) are W_UV.
        self.kv_up = nn.Linear(config.kv_latent_dim, 2 * width, bias=False)
        self.proj = nn.Linear(width, config.n_embd, bias=False)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, x: torch.Tensor, rotation: Rotation | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, n_head, T, d + rope_dim) and the latents c (B, 1, T, kv_latent_dim + rope_dim), the one
        "head" the cache stores; with ``rotation`` the last rope_dim numbers of each are rotated."""
        B, T, _ = x.shape
        q, c, k_rope = self.down(x).split([self.q_down_dim, self.kv_latent_dim, self.rope_dim], dim=-1)
        if self.q_latent_dim is not None:
            q = self.q_up(self.q_norm(q))
        q = q.view(B, T, self.n_head, self.head_dim + self.rope_dim).transpose(1, 2)
        q, q_rope = q.split([self.head_dim, self.rope_dim], dim=-1)
        c = self.kv_norm(c).unsqueeze(1)
        if rotation is None:
            return q, c
        q = torch.cat((q, rotate(q_rope, rotation)), dim=-1)
        return q, torch.cat((c, rotate(k_rope.unsqueeze(1), rotation)), dim=-1)

    def cache_entries(self) -> dict[str, tuple[int, int]]:
        return {"latent": (1, self.kv_latent_dim + self.rope_dim)}

    def rotary_entry(self) -> tuple[str, slice]:
        """The cached entry, and the part of it, that rotary positions rotate: the shared rotary key."""
        return "latent", slice(self.kv_latent_dim, None)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, value_embedding: None = None,
                rotation: Rotation | None = None) -> torch.Tensor:
        assert value_embedding is None, "value embeddings are grouped-query attention's only"
        B, T, C = x.shape
        q, c = self.split_heads(x, rotation)
        mask = None
        if cache is not None:
            (c,), mask = cache.update(self.layer_idx, c)
        if cache is not None and T == 1:  # decoding: attention in latent space
            y = self.attend_absorbed(q, c, mask)
        else:
            y = self.attend_expanded(q, c, mask)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))

    def expand(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every head's keys (B, n_head, S, d + rope_dim) and values (B, n_head, S, d) from the cached
        c (B, 1, S, r + rope_dim), in one product: the shared rotary key joins every head's key."""
        B, _, S, _ = c.shape
        latent, k_rope = c.split([self.kv_latent_dim, self.rope_dim], dim=-1)
        kv = self.kv_up(latent[:, 0]).view(B, S, 2 * self.n_head, self.head_dim).transpose(1, 2)
        k, v = kv.chunk(2, dim=1)
        if self.rope_dim:
            k = torch.cat((k, k_rope.expand(B, self.n_head, S, self.rope_dim)), dim=-1)
        return k, v

    def per_head(self, x: torch.Tensor, rotation: Rotation | None = None) -> tuple[torch.Tensor, ...]:
        q, c = self.split_heads(x, rotation)
        return (q, *self.expand(c))

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        w_uk, w_uv = self.kv_up.weight.chunk(2)
        shape = (self.n_head, self.head_dim, self.kv_latent_dim)
        return w_uk.view(shape), w_uv.view(shape)

    def attend_expanded(self, q: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        T, S = q.shape[2], c.shape[2]
        k, v = self.expand(c)
        if mask is None and T != S:
            mask = causal_mask(T, S, device=q.device)
        dropout_p = self.attn_dropout if self.training else 0.0
        return sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=mask is None)

    def attend_absorbed(self, q: torch.Tensor, c: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The same attention in latent space (derived above), the heads viewed as query positions of
        the latent, as in ``CausalSelfAttention._attend_token`` (batch-invariant on the CPU when
        kv_latent_dim is a multiple of 16)."""
        B, H, T, qk_dim = q.shape
        S = c.shape[2]
        w_uk, w_uv = self.up_weights()
        latent_q = torch.matmul(q[..., :self.head_dim], w_uk)
        values = c
        if self.rope_dim:  # the rotary part scores the cached rotary keys as it is; values are latents
            latent_q = torch.cat((latent_q, q[..., self.head_dim:]), dim=-1)
            values = c[..., :self.kv_latent_dim]
        latent_q = latent_q.view(B, 1, H * T, self.kv_latent_dim + self.rope_dim)
        if T > 1:  # one causal mask per head; a single query may read every latent it is given
            mask = causal_mask(T, S, device=q.device) if mask is None else mask
            mask = mask.repeat(*[1] * (mask.dim() - 2), H, 1)
        dropout_p = self.attn_dropout if self.training else 0.0
        latent_y = sdpa(
            latent_q, c, values, attn_mask=mask, dropout_p=dropout_p, scale=1.0 / math.sqrt(qk_dim))
        return torch.matmul(latent_y.view(B, H, T, self.kv_latent_dim), w_uv.transpose(1, 2))


# -------------------------------------------------------------------------------------------------
# The block and the model.


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        if config.attention == "mla":
            self.attn = LatentAttention(config, layer_idx)
        else:
            self.attn = CausalSelfAttention(config, layer_idx)
        self.ffn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.ffn = SwiGLU(config.n_embd, config.ffn_dim, config.dropout)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, value_embedding: torch.Tensor | None = None,
                rotation: Rotation | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cache, value_embedding, rotation)
        return x + self.ffn(self.ffn_norm(x))


class GPT(nn.Module):
    """Token embeddings (plus learned position embeddings with ``positions: learned``), ``n_layer``
    blocks, RMSNorm, LM head."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        if config.positions == "learned":
            self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        kv_width = config.n_kv_head * config.head_dim
        self.value_embs = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, kv_width)
                                         for i in config.value_embedding_layers})
        if config.tie_embeddings:
            # One matrix both reads tokens in and scores them out: fewer parameters, and the
            # output layer gets gradient for every token, not only the ones that appear as input.
            self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02) everywhere, unit norm gains, and residual output
        projections shrunk by 1/sqrt(2·n_layer) because each block adds two of them to the
        residual stream, whose variance would otherwise grow with depth. A zero value-gate weight
        opens every value-embedding gate half way (2·sigmoid(0) = 1)."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if name.endswith("value_gate"):
                nn.init.zeros_(module.weight)
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("attn.proj", "ffn.down")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None,
                rows: Sequence[int] | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits, and with ``targets`` the mean cross-entropy (targets of -1 ignored). With ``cache``,
        row i's chunk goes into cache row ``rows[i]`` (default i) at that row's length, which is also
        the position of its first token."""
        logits = self.logits(self._hidden_in(idx, cache, rows))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def next_token_logits(self, idx: torch.Tensor, cache: KVCache | None = None,
                          rows: Sequence[int] | None = None) -> torch.Tensor:
        """The head on the last position only, all a decoding step needs: often the largest matmul."""
        return self.logits(self._hidden_in(idx, cache, rows)[:, -1])

    def _hidden_in(self, idx: torch.Tensor, cache: KVCache | None, rows: Sequence[int] | None) -> torch.Tensor:
        if cache is None:
            return self.hidden_states(idx)
        hidden = self.hidden_states(idx, cache.begin(idx.shape[1], rows), cache)
        cache.end()
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The one place logits are made, for every caller and the ONNX graph."""
        return self.lm_head(hidden)

    def hidden_states(self, idx: torch.Tensor, positions: torch.Tensor | None = None, cache: LayerCache | None = None,
                      *, on_block_input: Callable[[Block, torch.Tensor, Rotation | None], None] | None = None,
                      ) -> torch.Tensor:
        """The model's one entry point under the head, at ``positions`` (default 0..T-1). Every layer's
        attention reads what ``cache.update`` returns: a ``KVCache`` pass, or the ONNX graph's past
        tensors. ``on_block_input(block, x, rotation)`` sees what each block reads."""
        T = idx.shape[1]
        if positions is None:
            assert 1 <= T <= self.config.block_size, f"{T} tokens do not fit block_size {self.config.block_size}"
        x = self.tok_emb(idx)
        if self.config.positions == "learned":
            # A slice of the table: the same values as a lookup, and a cheaper backward.
            x = x + (self.pos_emb.weight[:T] if positions is None else self.pos_emb(positions))
        rotation = self.rotation(T, positions)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            if on_block_input is not None:
                on_block_input(block, x, rotation)
            # Value embeddings depend on the token alone: a cache holds the values they were mixed into.
            value = self.value_embs[str(i)](idx) if str(i) in self.value_embs else None
            x = block(x, cache, value, rotation)
        return self.norm(x)

    def rotation(self, T: int, positions: torch.Tensor | None = None) -> Rotation | None:
        """What rotary positions turn each layer's queries and keys by, at ``positions`` (default
        0..T-1), computed once per pass for every layer; None for the other kinds."""
        if self.config.positions != "rope":
            return None
        if positions is None:
            positions = torch.arange(T, device=self.tok_emb.weight.device).unsqueeze(0)
        return rotary(positions, self.config.rope_dim, self.config.rope_theta)

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the (B, n_head, T, T) probabilities the layer applies to its values, from its own
        projections, for ``analysis`` to draw and score."""
        return [causal_attention_weights(q, k) for q, k in self.attention_queries_keys(idx)]

    @torch.no_grad()
    def attention_queries_keys(self, idx: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the per-head queries and keys that ``attention_weights`` scores."""
        queries_keys = []

        def keep(block: Block, x: torch.Tensor, rotation: Rotation | None) -> None:
            q, k, _ = block.attn.per_head(block.attn_norm(x), rotation)
            queries_keys.append((q, k))

        self.hidden_states(idx, on_block_input=keep)
        return queries_keys

    def cache_entries(self) -> dict[str, tuple[int, int]]:
        return self.blocks[0].attn.cache_entries()

    def move_entries(self, entries: dict[str, torch.Tensor], offset: int) -> None:
        """Cached ``entries`` (by name, each (n_layer, heads, T, dim), as ``KVCache.read`` gives them)
        made, in place, what they would be ``offset`` positions later. Rotary keys turn by the
        distance (R_(t+o) = R_o R_t); without positions nothing changes. Learned positions were added
        to the input, before every layer, and cannot move."""
        assert self.config.positions != "learned", "entries made with learned positions cannot move"
        if self.config.positions != "rope" or offset == 0:
            return
        name, part = self.blocks[0].attn.rotary_entry()
        keys = entries[name][..., part]
        distance = torch.full((1, 1), offset, device=keys.device)
        entries[name][..., part] = rotate(keys, rotary(distance, self.config.rope_dim, self.config.rope_theta))

    def init_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None,
                   whole_buffers: int = 0) -> KVCache:
        """An empty cache on the model's device, in its parameter dtype unless told otherwise."""
        max_len = self.config.block_size if max_len is None else max_len
        assert 1 <= max_len <= self.config.block_size, "positions past block_size have no embedding"
        weight = self.tok_emb.weight
        return KVCache(self.config.n_layer, batch_size, max_len, self.cache_entries(), whole_buffers=whole_buffers,
                       device=weight.device, dtype=weight.dtype if dtype is None else dtype)

    def num_params(self, include_embeddings: bool = True) -> int:
        """``include_embeddings=False`` leaves out the embedding tables, as scaling-law parameter
        counts do; an untied LM head is a matmul layer and stays in."""
        total = sum(p.numel() for p in self.parameters())  # parameters() yields shared tensors once
        if not include_embeddings:
            total -= self.tok_emb.weight.numel()
            if self.config.positions == "learned":
                total -= self.pos_emb.weight.numel()
            total -= sum(table.weight.numel() for table in self.value_embs.values())
        return total

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs (forward + backward) per token at context ``seq_len`` (default block_size):
        6·N for the N matmul weights (2 per multiply-add forward, 4 backward), plus 6 times the scores
        and weighted sum, over the full seq_len x seq_len matrix (the PaLM / nanoGPT convention for
        MFU). Latent attention trains expanded: the same per-head scores, its up-projections among N."""
        cfg = self.config
        seq_len = cfg.block_size if seq_len is None else seq_len
        matmul_params = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        qk_dim = cfg.head_dim + (cfg.rope_dim if cfg.attention == "mla" else 0)
        attention = cfg.n_layer * cfg.n_head * (qk_dim + cfg.head_dim) * seq_len
        return 6 * matmul_params + 6 * attention


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside torch.compile (``_orig_mod``) and DDP (``module``) wrappers: the one
    to save or evaluate, with plain parameter names and no gradient hooks."""
    while isinstance(inner := getattr(model, "_orig_mod", None) or getattr(model, "module", None), nn.Module):
        model = inner
    return model


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode (no dropout) for the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
