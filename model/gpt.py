"""The GPT, from token ids to logits, top to bottom: config, RMSNorm, SwiGLU, attention, block, model.

A decoder-only transformer with grouped-query attention (query head h reads key/value head
``h // (n_head // n_kv_head)``), learned absolute positions, pre-norm RMSNorm blocks with a
SwiGLU feed-forward, and an LM head tied to the token embedding. The KV cache lives in
``model.kv_cache``; sampling and the decode loop in ``model.generation``, which imports this file
(never the other way round).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from common.config import build, check_types, require
from model.kv_cache import KVCache
from model.mla import LatentAttention

_REQUIRED_INTS = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd")
ATTENTION_KINDS = ("gqa", "mla")


@dataclass
class GPTConfig:
    """Sizes of a decoder-only GPT with grouped-query attention and learned positions.

    ``n_kv_head`` key/value heads are shared by ``n_head // n_kv_head`` query heads each:
    1 gives multi-query attention, ``n_head`` gives standard multi-head attention.
    ``ffn_hidden=None`` derives the SwiGLU width from ``n_embd`` (see ``ffn_dim``).

    ``attention="mla"`` swaps in multi-head latent attention (``model.mla``): keys and values are
    read from one cached latent of ``kv_latent_dim`` numbers per token (required), and the query
    optionally from its own latent of ``q_latent_dim``. Every head then has its own key and value,
    so ``n_kv_head`` must equal ``n_head``; the latent sizes are refused with ``attention="gqa"``.
    Served decoding is batch-invariant on the CPU when ``kv_latent_dim`` is a multiple of 16, as
    it is for grouped-query attention when ``head_dim`` is (see ``CausalSelfAttention._attend_token``).
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_hidden: int | None = None
    dropout: float = 0.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    attention: str = "gqa"
    kv_latent_dim: int | None = None
    q_latent_dim: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        for name in (*_REQUIRED_INTS, "ffn_hidden"):
            value = getattr(self, name)
            require(value is None or value >= 1, f"{name} must be a positive integer, got {value}; set it to at least 1")
        require(self.n_embd % self.n_head == 0, f"n_embd ({self.n_embd}) must be divisible by n_head "
                f"({self.n_head}); pick n_head from the divisors of n_embd or change n_embd")
        require(self.n_head % self.n_kv_head == 0, f"n_head ({self.n_head}) must be divisible by n_kv_head "
                f"({self.n_kv_head}); set n_kv_head to a divisor of n_head (1 = multi-query, n_head = multi-head)")
        self._check_attention()
        require(0.0 <= self.dropout < 1.0, f"dropout must be in [0, 1), got {self.dropout}; use 0.0 to disable it")
        require(self.norm_eps > 0.0, f"norm_eps must be > 0, got {self.norm_eps}; the default is 1e-5")

    def _check_attention(self) -> None:
        require(self.attention in ATTENTION_KINDS, f"attention must be one of {', '.join(ATTENTION_KINDS)}, "
                f"got {self.attention!r}; use gqa (grouped-query) or mla (multi-head latent)")
        for name in ("kv_latent_dim", "q_latent_dim"):
            value = getattr(self, name)
            if self.attention != "mla":
                require(value is None, f"{name} is set ({value}) but attention is {self.attention!r}; "
                        f"remove {name} or set attention: mla")
            else:
                require(value is None or value >= 1, f"{name} must be a positive integer, got {value}; "
                        f"set it to at least 1")
        if self.attention == "mla":
            require(self.kv_latent_dim is not None, "attention mla needs kv_latent_dim, the width of the "
                    "cached key/value latent; set it (e.g. kv_latent_dim: 64)")
            require(self.n_kv_head == self.n_head, f"attention mla gives every head its own key and value "
                    f"(read from the shared latent), so n_kv_head must equal n_head ({self.n_head}), "
                    f"got {self.n_kv_head}; set n_kv_head: {self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """SwiGLU hidden width: ``ffn_hidden`` if given, else 8/3·n_embd rounded up to 64.

        SwiGLU has three matrices instead of two, so 8/3 (not 4) keeps the parameter count of a
        classic 4x MLP; a multiple of 64 keeps matmul shapes friendly to vectorised kernels.
        """
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return 64 * -(-int(8 * self.n_embd / 3) // 64)

    def num_params(self) -> int:
        """Parameters of a GPT of this shape (a tied head counted once), from the sizes alone:
        checking that a model fits must not build one, not even on the meta device, whose
        initialisers import torch's compiler (seconds at start-up)."""
        C = self.n_embd
        attention = C * (self.n_head + 2 * self.n_kv_head) * self.head_dim + C * C
        if self.attention == "mla":  # model.mla.LatentAttention's matrices and latent norm gains
            r, q = self.kv_latent_dim, self.q_latent_dim
            query = C * C if q is None else C * q + q + q * C
            attention = query + C * r + r + r * 2 * C + C * C
        ffn = 3 * C * self.ffn_dim
        head = 0 if self.tie_embeddings else self.vocab_size * C
        return (self.vocab_size + self.block_size) * C + self.n_layer * (attention + ffn + 2 * C) + C + head

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        """Build a config from a plain dict (JSON or YAML), rejecting unknown or missing keys."""
        return build(cls, d, "model")


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned per-channel gain.

    Unlike LayerNorm it neither centres nor adds a bias: cheaper, and as good in practice.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The fused kernel is one op instead of five, which matters in the per-token decode loop.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


# A batch-invariant pass computes one-token rows through every linear layer in blocks of this many.
DECODE_ROW_BLOCK = 16


def linear(layer: nn.Linear, x: torch.Tensor, row_blocks: bool = False) -> torch.Tensor:
    """``layer(x)``; with ``row_blocks``, the rows of x in blocks of exactly ``DECODE_ROW_BLOCK``.

    A BLAS library picks its kernel, and with it the order of summation, from the matrix shape:
    a row multiplied alone and the same row among 15 others may differ in the last bits, and in
    generation a near-tie then picks another token. Padded to whole blocks, a row gets the same
    arithmetic whether it is served alone or batched with any other requests. The padding costs
    a single stream speed, so only the batch-invariant decode step (the serving engine's) asks.
    """
    if not row_blocks:
        return layer(x)
    rows = x.reshape(-1, x.shape[-1])
    padded = F.pad(rows, (0, 0, 0, -rows.shape[0] % DECODE_ROW_BLOCK))
    if padded.shape[0] == DECODE_ROW_BLOCK:
        out = F.linear(padded, layer.weight, layer.bias)
    else:
        out = torch.cat([F.linear(block, layer.weight, layer.bias) for block in padded.split(DECODE_ROW_BLOCK)])
    return out[:rows.shape[0]].view(*x.shape[:-1], -1)


class SwiGLU(nn.Module):
    """Feed-forward ``down(silu(gate(x)) * up(x))``.

    Gate and up projections are stored as one matrix so a decode step does one matmul instead of
    two; on a CPU the per-call overhead of a small matmul is comparable to its arithmetic.
    """

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, row_blocks: bool = False) -> torch.Tensor:
        gate, up = linear(self.gate_up, x, row_blocks).chunk(2, dim=-1)
        return self.dropout(linear(self.down, F.silu(gate) * up, row_blocks))


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (q_len, k_len) mask, True where attending is allowed, aligned bottom-right.

    The queries are the last ``q_len`` of ``k_len`` positions, so query i may read keys
    ``j <= k_len - q_len + i``. (SDPA's ``is_causal=True`` aligns top-left, which is only right
    when ``q_len == k_len``.)
    """
    q_pos = torch.arange(q_len, device=device).unsqueeze(1) + (k_len - q_len)
    return torch.arange(k_len, device=device).unsqueeze(0) <= q_pos


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

    def split_heads(self, x: torch.Tensor, row_blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project x (B, T, C) to q (B, n_head, T, d) and k, v (B, n_kv_head, T, d)."""
        B, T, _ = x.shape
        d = self.head_dim
        sizes = [self.n_head * d, self.n_kv_head * d, self.n_kv_head * d]
        q, k, v = linear(self.qkv, x, row_blocks).split(sizes, dim=-1)
        q = q.view(B, T, self.n_head, d).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, d).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, d).transpose(1, 2)
        return q, k, v

    def cache_entries(self) -> dict[str, tuple[int, int]]:
        """What this attention caches per token and layer, as ``KVCache`` takes it: K and V of the
        key/value heads only."""
        return {"k": (self.n_kv_head, self.head_dim), "v": (self.n_kv_head, self.head_dim)}

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, row_blocks: bool = False) -> torch.Tensor:
        """Attend over this chunk, and over the cache's earlier positions when one is given.

        The caller (GPT) begins the cache's pass before the first layer and ends it after the
        last, so every layer writes at the same positions. ``row_blocks``: see ``linear``.
        """
        B, T, C = x.shape
        q, k, v = self.split_heads(x, row_blocks)
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


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        if config.attention == "mla":
            self.attn = LatentAttention(config, layer_idx, norm=RMSNorm, linear=linear)
        else:
            self.attn = CausalSelfAttention(config, layer_idx)
        self.ffn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.ffn = SwiGLU(config.n_embd, config.ffn_dim, config.dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, row_blocks: bool = False) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cache, row_blocks)
        return x + self.ffn(self.ffn_norm(x), row_blocks)


class GPT(nn.Module):
    """Token + learned absolute position embeddings, ``n_layer`` blocks, RMSNorm, LM head."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            # One matrix both reads tokens in and scores them out: fewer parameters, and the
            # output layer gets gradient for every token, not only the ones that appear as input.
            self.lm_head.weight = self.tok_emb.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2 initialisation: N(0, 0.02) everywhere, unit norm gains, and residual output
        projections shrunk by 1/sqrt(2·n_layer) because each block adds two of them to the
        residual stream, whose variance would otherwise grow with depth."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("attn.proj", "ffn.down")) else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None,
        rows: Sequence[int] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, T, vocab) for token ids ``idx`` (B, T); with ``targets`` also the mean
        cross-entropy (positions with target -1 are ignored). With ``cache``, row i's chunk is
        written into cache row ``rows[i]`` (default: row i) at that row's length, which is also
        the position of its first token."""
        logits = self.lm_head(self._trunk(idx, cache, rows, False))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def next_token_logits(
        self, idx: torch.Tensor, cache: KVCache | None = None, rows: Sequence[int] | None = None,
        batch_invariant: bool = False,
    ) -> torch.Tensor:
        """Logits (B, vocab) after the last token of each row of ``idx``: the head runs on one
        position only, which is all a decoding step needs (the head is vocab x n_embd, often the
        largest matmul). ``cache`` and ``rows`` as in ``forward``.

        ``batch_invariant``: a one-token pass computes each row bit for bit as it would alone, in
        any batch, at any length (whole cache rows under a mask, products in fixed row blocks:
        see ``linear``); the serving engine asks for it. On the CPU it holds when head_dim is a
        multiple of 16 (see ``_attend_token``; kv_latent_dim for latent attention). Longer chunks take
        the plain path either way."""
        row_blocks = batch_invariant and idx.shape[1] == 1
        return linear(self.lm_head, self._trunk(idx, cache, rows, row_blocks)[:, -1], row_blocks)

    def _trunk(
        self, idx: torch.Tensor, cache: KVCache | None, rows: Sequence[int] | None, row_blocks: bool
    ) -> torch.Tensor:
        T = idx.shape[1]
        if cache is None:
            assert 1 <= T <= self.config.block_size, f"{T} tokens do not fit block_size {self.config.block_size}"
            # A slice of the table: the same values as a lookup, and a cheaper backward.
            positions = self.pos_emb.weight[:T]
        else:
            # Learned absolute positions: each row's new tokens sit at that row's length onwards.
            positions = self.pos_emb(cache.begin(T, rows, whole_buffers=row_blocks))
        x = self.drop(self.tok_emb(idx) + positions)
        for block in self.blocks:
            x = block(x, cache, row_blocks)
        if cache is not None:
            cache.end()
        return self.norm(x)

    def init_cache(self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None) -> KVCache:
        """An empty KV cache for ``batch_size`` rows and up to ``max_len`` (<= block_size) positions,
        on the model's device, in its parameter dtype unless told otherwise."""
        max_len = self.config.block_size if max_len is None else max_len
        assert 1 <= max_len <= self.config.block_size, "positions past block_size have no embedding"
        weight = self.tok_emb.weight
        return KVCache(
            self.config.n_layer, batch_size, max_len, self.blocks[0].attn.cache_entries(),
            device=weight.device, dtype=weight.dtype if dtype is None else dtype,
        )

    def num_params(self, include_embeddings: bool = True) -> int:
        """Number of distinct parameters (a tied head is counted once).

        ``include_embeddings=False`` leaves out the token and position tables, as in scaling-law
        parameter counts; an untied LM head is a matmul layer and stays in.
        """
        total = sum(p.numel() for p in self.parameters())  # parameters() yields shared tensors once
        if not include_embeddings:
            total -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return total

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs (forward + backward) per token at context ``seq_len`` (default block_size).

        6·N for the N weights used in matmuls (2 per multiply-add forward, 4 backward), plus the
        attention scores and weighted sum: 2 matmuls of n_head·head_dim·seq_len multiply-adds per
        layer and token, times 6 as well. This counts the full seq_len x seq_len score matrix (the
        PaLM / nanoGPT convention for MFU), not only its causal half. Latent attention trains in its
        expanded form (``model.mla``): the same per-head scores, its up-projections among the matmuls.
        """
        cfg = self.config
        seq_len = cfg.block_size if seq_len is None else seq_len
        matmul_params = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        attention = 2 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
        return 6 * matmul_params + 6 * attention


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside torch.compile (``_orig_mod``) and DDP (``module``) wrappers: the one
    to save or evaluate, with plain parameter names and no gradient hooks."""
    while isinstance(inner := getattr(model, "_orig_mod", None) or getattr(model, "module", None), nn.Module):
        model = inner
    return model
