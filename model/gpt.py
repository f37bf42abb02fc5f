"""The GPT, from token ids to logits, top to bottom: config, block, model.

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
from model.gqa import CausalSelfAttention
from model.layers import RMSNorm, SwiGLU, causal_attention_weights, linear
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
        see ``model.layers.linear``); the serving engine asks for it. On the CPU it holds when head_dim is a
        multiple of 16 (see ``model.gqa``'s ``_attend_token``; kv_latent_dim for latent attention). Longer chunks take
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

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Per layer, the (B, n_head, T, T) attention probabilities of token ids ``idx`` (B, T) read
        from position 0: what each layer's attention applies to its values, from the layer's own
        projections (``per_head``). The analysis package (``attention.py``) draws and scores them."""
        return [causal_attention_weights(q, k) for q, k in self.attention_queries_keys(idx)]

    @torch.no_grad()
    def attention_queries_keys(self, idx: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the per-head queries and keys, each (B, n_head, T, d), of token ids ``idx``
        (B, T) read from position 0: what ``attention_weights`` scores, for looking at the scores
        themselves (``attention.py --compare-scale``)."""
        T = idx.shape[1]
        assert 1 <= T <= self.config.block_size, f"{T} tokens do not fit block_size {self.config.block_size}"
        x = self.drop(self.tok_emb(idx) + self.pos_emb.weight[:T])
        queries_keys = []
        for block in self.blocks:
            q, k, _ = block.attn.per_head(block.attn_norm(x))
            queries_keys.append((q, k))
            x = block(x)
        return queries_keys

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
