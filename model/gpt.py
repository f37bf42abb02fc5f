"""The GPT, from token ids to logits, top to bottom: config, RMSNorm, SwiGLU, attention, block, model.

A decoder-only transformer with grouped-query attention (query head h reads key/value head
``h // (n_head // n_kv_head)``), learned absolute positions, pre-norm RMSNorm blocks with a
SwiGLU feed-forward, and an LM head tied to the token embedding. The decode path (the KV cache
and sampling) lives in ``model.kv_cache`` and ``model.generation``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from common.config import build, check_types, require
from model.rms_norm_cpu import RMSNormCPUFunction, use_cpu_backward
from model.generation import generate_tokens
from model.kv_cache import KVCache, RowStep
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
        if use_cpu_backward(x, self.weight):
            return RMSNormCPUFunction.apply(x, self.weight, self.eps)
        # The fused kernel is one op instead of five, which matters in the per-token decode loop.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


# Inside batch_invariant(), one-token rows go through every linear layer in blocks of this many.
DECODE_ROW_BLOCK = 16
_row_blocks = contextvars.ContextVar("row_blocks", default=False)


@contextlib.contextmanager
def batch_invariant() -> Iterator[None]:
    """Within this context, each decoding row's result is the same bits whatever other rows are
    computed beside it (see ``BatchInvariantLinear``). The serving engine decodes in it."""
    token = _row_blocks.set(True)
    try:
        yield
    finally:
        _row_blocks.reset(token)


class BatchInvariantLinear(nn.Linear):
    """``nn.Linear`` that, inside ``batch_invariant()``, computes one-token rows (decoding) in
    blocks of exactly ``DECODE_ROW_BLOCK`` rows.

    A BLAS library picks its kernel, and with it the order of summation, from the matrix shape:
    a row multiplied alone and the same row among 15 others differ in the last bits, and in
    generation a near-tie then picks another token. Padded to whole blocks, a row gets the same
    arithmetic whether it is served alone or batched with any other requests. Multiplying the
    padding costs a single stream speed, so outside the context (training, generate.py) every
    product is the plain one.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _row_blocks.get() or (x.dim() > 2 and x.shape[-2] != 1):
            return F.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])
        padded = F.pad(rows, (0, 0, 0, -rows.shape[0] % DECODE_ROW_BLOCK))
        if padded.shape[0] == DECODE_ROW_BLOCK:
            out = F.linear(padded, self.weight, self.bias)
        else:
            out = torch.cat([F.linear(block, self.weight, self.bias) for block in padded.split(DECODE_ROW_BLOCK)])
        return out[:rows.shape[0]].view(*x.shape[:-1], -1)


class SwiGLU(nn.Module):
    """Feed-forward ``down(silu(gate(x)) * up(x))``.

    Gate and up projections are stored as one matrix so a decode step does one matmul instead of
    two; on a CPU the per-call overhead of a small matmul is comparable to its arithmetic.
    """

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.gate_up = BatchInvariantLinear(dim, 2 * hidden, bias=False)
        self.down = BatchInvariantLinear(hidden, dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.dropout(self.down(F.silu(gate) * up))


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
        self.qkv = BatchInvariantLinear(config.n_embd, qkv_dim, bias=False)
        self.proj = BatchInvariantLinear(config.n_embd, config.n_embd, bias=False)
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

    def forward(self, x: torch.Tensor, cache: KVCache | RowStep | None = None) -> torch.Tensor:
        """Attend over this chunk, and over the cache's earlier positions when one is given.

        The caller (GPT.forward) checks that the chunk fits and advances the cache after the
        last layer, so every layer writes at the same position.
        """
        B, T, C = x.shape
        q, k, v = self.split_heads(x)
        if isinstance(cache, RowStep) or (cache is not None and T == 1 and _row_blocks.get()):
            y = self._attend_token(q, *cache.write_token(self.layer_idx, k, v))
        else:
            if cache is not None:
                k, v = cache.update(self.layer_idx, k, v)
            y = self._attend(q, k, v)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))

    def _attend_token(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """One new token per row against keys ``k, v``; ``mask`` hides the slots of the rows'
        whole K/V buffers not written yet. That is how rows at different lengths decode
        together (``RowStep``), and how every one-token step decodes inside ``batch_invariant``.
        The shapes are the same at every position and in every batch, so a row's arithmetic
        never depends on how far it is or on which rows decode beside it: a request decodes bit
        for bit alike alone and batched with others. (On the CPU this also needs every row of
        q, k and v to start 64 bytes apart from the others, which holds when head_dim is a
        multiple of 16: the kernels' summation order depends on where a row starts in memory.)

        Viewing the group's query heads as its query positions lets the group share its K/V
        head with no copy, on any backend and torch version; for one query it is also faster
        than ``enable_gqa``."""
        B, H, _, d = q.shape
        grouped = q.view(B, self.n_kv_head, H // self.n_kv_head, d)
        dropout_p = self.attn_dropout if self.training else 0.0
        return F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask, dropout_p=dropout_p).view(B, H, 1, d)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, H, T, d = q.shape
        S = k.shape[2]
        dropout_p = self.attn_dropout if self.training else 0.0
        if T == 1:  # the newest token may read every key
            return self._attend_token(q, k, v, mask=None)
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


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        if config.attention == "mla":
            self.attn = LatentAttention(config, layer_idx, BatchInvariantLinear, RMSNorm)
        else:
            self.attn = CausalSelfAttention(config, layer_idx)
        self.ffn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.ffn = SwiGLU(config.n_embd, config.ffn_dim, config.dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | RowStep | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cache)
        return x + self.ffn(self.ffn_norm(x))


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
        self.lm_head = BatchInvariantLinear(config.n_embd, config.vocab_size, bias=False)
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
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | RowStep | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, T, vocab) for token ids ``idx`` (B, T); with ``targets`` also the mean
        cross-entropy (positions with target -1 are ignored). With ``cache``, the chunk sits at
        positions ``cache.pos + arange(T)`` and is appended to the cache; with a ``RowStep``, row
        i's one token sits at the length of its own cache row."""
        logits = self.lm_head(self._trunk(idx, cache))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def next_token_logits(self, idx: torch.Tensor, cache: KVCache | RowStep | None = None) -> torch.Tensor:
        """Logits (B, vocab) after the last token of ``idx``: the head runs on one position only,
        which is all a decoding step needs (the head is vocab x n_embd, often the largest matmul)."""
        return self.lm_head(self._trunk(idx, cache)[:, -1])

    def _trunk(self, idx: torch.Tensor, cache: KVCache | RowStep | None) -> torch.Tensor:
        if idx.dim() != 2:
            raise ValueError(f"idx must be a (batch, time) tensor of token ids, got shape {tuple(idx.shape)}")
        B, T = idx.shape
        if isinstance(cache, RowStep):
            # Continuous batching: each row's token sits at that row's own position.
            cache.check(B, T, self.config.block_size)
            positions = self.pos_emb(cache.positions())
        else:
            start = self._check_positions(B, T, cache)
            # Positions are always contiguous, so a slice of the table replaces an index lookup;
            # the checks above guarantee the slice is complete (never silently short).
            positions = self.pos_emb.weight[start:start + T]
        x = self.drop(self.tok_emb(idx) + positions)
        for block in self.blocks:
            x = block(x, cache)
        if cache is not None:
            cache.advance(T)
        return self.norm(x)

    def _check_positions(self, B: int, T: int, cache: KVCache | None) -> int:
        block_size = self.config.block_size
        if T == 0:
            raise ValueError("idx has no tokens; pass at least one token per row")
        if cache is None:
            if T > block_size:
                raise ValueError(
                    f"sequence length {T} exceeds block_size {block_size}; crop the input to its "
                    f"last {block_size} tokens (generate_tokens does this for you)"
                )
            return 0
        if B != cache.batch_size:
            raise ValueError(f"idx has batch size {B} but the cache was made for {cache.batch_size}; "
                             f"create it with init_cache({B})")
        if cache.pos + T > block_size:
            raise ValueError(
                f"positions {cache.pos}..{cache.pos + T - 1} exceed block_size {block_size}; the model "
                f"has no position embedding past {block_size - 1}: reset() the cache and re-encode "
                f"a shorter window (generate_tokens slides its window automatically)"
            )
        cache.check_room(T)
        return cache.pos

    def init_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """An empty KV cache for ``batch_size`` rows and up to ``max_len`` (<= block_size) positions,
        on the model's device, in its parameter dtype unless told otherwise."""
        cfg = self.config
        max_len = cfg.block_size if max_len is None else max_len
        if not 1 <= max_len <= cfg.block_size:
            raise ValueError(f"max_len must be in [1, block_size={cfg.block_size}], got {max_len}; "
                             f"positions past block_size have no embedding")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        weight = self.tok_emb.weight
        # Latent attention caches one latent per token (a single "head" of kv_latent_dim) and no values.
        mla = cfg.attention == "mla"
        heads, width, value_dim = (1, cfg.kv_latent_dim, 0) if mla else (cfg.n_kv_head, cfg.head_dim, None)
        return KVCache(
            cfg.n_layer, batch_size, heads, max_len, width, value_dim=value_dim,
            device=weight.device,
            dtype=weight.dtype if dtype is None else dtype,
        )

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **sampling: Any) -> torch.Tensor:
        """``idx`` (B, T) followed by ``max_new_tokens`` generated tokens; ``sampling`` takes the
        keyword arguments of ``model.generation.generate_tokens``."""
        columns = [token.unsqueeze(1) for token in generate_tokens(self, idx, max_new_tokens, **sampling)]
        return torch.cat([idx, *columns], dim=1)

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
