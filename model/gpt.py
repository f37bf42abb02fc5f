"""The decoder-only GPT: embeddings, pre-norm blocks, tied LM head, and size/FLOP accounting."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import CausalSelfAttention
from model.config import GPTConfig
from model.kv_cache import KVCache
from model.layers import RMSNorm, SwiGLU


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + ffn(norm(x))."""

    def __init__(self, config: GPTConfig, layer_idx: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ffn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.ffn = SwiGLU(config.n_embd, config.ffn_dim, config.dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
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

    # ---------------------------------------------------------------- forward passes

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits (B, T, vocab) for token ids ``idx`` (B, T); with ``targets`` also the mean
        cross-entropy (positions with target -1 are ignored). With ``cache``, the chunk sits at
        positions ``cache.pos + arange(T)`` and is appended to the cache."""
        logits = self.lm_head(self._trunk(idx, cache))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def next_token_logits(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits (B, vocab) after the last token of ``idx``: the head runs on one position only,
        which is all a decoding step needs (the head is vocab x n_embd, often the largest matmul)."""
        return self.lm_head(self._trunk(idx, cache)[:, -1])

    def _trunk(self, idx: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        if idx.dim() != 2:
            raise ValueError(f"idx must be a (batch, time) tensor of token ids, got shape {tuple(idx.shape)}")
        B, T = idx.shape
        start = self._check_positions(B, T, cache)
        # Positions are always contiguous, so a slice of the table replaces an index lookup;
        # the checks above guarantee the slice is complete (never silently short).
        x = self.tok_emb(idx) + self.pos_emb.weight[start:start + T]
        x = self.drop(x)
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

    # ---------------------------------------------------------------- inference helpers

    def init_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """An empty KV cache for ``batch_size`` rows and up to ``max_len`` (<= block_size) positions,
        on the model's device and in its parameter dtype unless told otherwise."""
        cfg = self.config
        max_len = cfg.block_size if max_len is None else max_len
        if not 1 <= max_len <= cfg.block_size:
            raise ValueError(f"max_len must be in [1, block_size={cfg.block_size}], got {max_len}; "
                             f"positions past block_size have no embedding")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        weight = self.tok_emb.weight
        return KVCache(
            cfg.n_layer, batch_size, cfg.n_kv_head, max_len, cfg.head_dim,
            device=weight.device if device is None else device,
            dtype=weight.dtype if dtype is None else dtype,
        )

    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float = 1.0,
        use_cache: bool = True,
        generator: torch.Generator | list[torch.Generator] | None = None,
        keep_fraction: float = 0.5,
    ) -> torch.Tensor:
        """``idx`` (B, T) followed by ``max_new_tokens`` generated tokens; see generate_tokens."""
        from model.generation import generate_tokens  # generation imports this module

        out = torch.empty(idx.shape[0], idx.shape[1] + max_new_tokens, dtype=torch.long, device=idx.device)
        out[:, : idx.shape[1]] = idx
        steps = generate_tokens(
            self, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=repetition_penalty, use_cache=use_cache, generator=generator,
            keep_fraction=keep_fraction,
        )
        for i, token in enumerate(steps):
            out[:, idx.shape[1] + i] = token
        return out

    # ---------------------------------------------------------------- accounting

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
        PaLM / nanoGPT convention for MFU), not only its causal half.
        """
        cfg = self.config
        seq_len = cfg.block_size if seq_len is None else seq_len
        matmul_params = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        attention = 2 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
        return 6 * matmul_params + 6 * attention
