"""The model's configuration: its sizes and options, and the checks that refuse what no model can be
built from (``model.config_checks`` words them for a user). ``model.gpt`` builds the network from it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from common.config import Removed, check_types, require, typed_values
from model.config_checks import ATTENTION_KINDS, POSITION_KINDS, POSITIVE_INTS, explain_model_values


@dataclass
class GPTConfig:
    """Sizes of a decoder-only GPT, and its options (docs/training.md).

    ``n_head // n_kv_head`` query heads share each key/value head: 1 key/value head is multi-query
    attention, ``n_head`` of them multi-head attention. ``attention="mla"`` reads every head's key
    and value from one cached latent of ``kv_latent_dim`` numbers per token (``LatentAttention``).
    Served decoding is batch-invariant on the CPU when ``head_dim`` (or ``kv_latent_dim``, plus
    ``rope_dim`` with rotary positions) is a multiple of 16 (see ``CausalSelfAttention._attend_token``).

    ``positions``: ``learned`` adds a learned embedding per absolute position to the input;
    ``rope`` rotates queries and keys by their position inside attention (``rope_theta`` is the
    base of its wavelengths); ``none`` gives no position at all, and the causal mask alone tells a
    token what came before it.
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_hidden: int | None = None  # None: derived from n_embd (ffn_dim)
    dropout: float = 0.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    attention: str = "gqa"
    kv_latent_dim: int | None = None
    q_latent_dim: int | None = None
    value_embeddings: bool = False
    positions: str = "learned"
    rope_theta: float = 10000.0
    # Options that lost by the records (docs/records.md), at the value that turned them off (common.config).
    REMOVED_KEYS: ClassVar[dict[str, Removed]] = {
        "bigram_buckets": Removed(None), "mtp_weight": Removed(0.0), "mlp": Removed("swiglu"),
        "qk_norm": Removed(False), "logit_softcap": Removed(None), "residual_scalars": Removed(False),
        "zero_init": Removed(False)}

    def __post_init__(self) -> None:
        # Plain checks against programmer errors: ``from_dict`` has explained a user's values already.
        check_types(self)
        mla = self.attention == "mla"
        sizes = [getattr(self, name) for name in (*POSITIVE_INTS, "kv_latent_dim", "q_latent_dim")]
        _expect(all(size is None or size >= 1 for size in sizes), "sizes must be >= 1")
        _expect(self.n_embd % self.n_head == 0 and self.n_head % self.n_kv_head == 0, "heads must divide evenly")
        _expect(self.attention in ATTENTION_KINDS, "unknown attention")
        _expect(mla == (self.kv_latent_dim is not None) and (mla or self.q_latent_dim is None), "latent sizes")
        _expect(not mla or self.n_kv_head == self.n_head, "mla needs n_kv_head == n_head")
        # The gate that mixes a value embedding in reads the layer's input, which a latent-only
        # cache does not keep: cached positions could not be decoded again from the latent alone.
        _expect(not (mla and self.value_embeddings), "value embeddings need gqa")
        _expect(0.0 <= self.dropout < 1.0 and self.norm_eps > 0.0, "dropout or norm_eps out of range")
        _expect(self.positions in POSITION_KINDS and 0.0 < self.rope_theta < math.inf, "unknown positions")
        _expect(self.positions != "rope" or self.rope_dim % 2 == 0, "rope rotates pairs: rope_dim must be even")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        """The config of a model section written by a user (YAML, JSON): unknown, missing,
        mistyped and impossible values are refused in one line each (``model.config_checks``)."""
        values = typed_values(cls, d, "model")
        try:
            explain_model_values(values)
        except ValueError as e:
            raise type(e)(f"model: {e}") from None
        return cls(**values)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def rope_dim(self) -> int:
        """Numbers of each query and key head that rotary positions rotate (0 without them): the whole
        head for grouped-query attention; for latent attention a decoupled part beside the head,
        half its size as in DeepSeek-V3 (``LatentAttention``)."""
        if self.positions != "rope":
            return 0
        return self.head_dim // 2 if self.attention == "mla" else self.head_dim

    @property
    def ffn_dim(self) -> int:
        """Feed-forward hidden width: ``ffn_hidden`` if given, else 8/3·n_embd rounded up to 64.
        SwiGLU has three matrices instead of two, so 8/3 (not 4) keeps the parameter count of a
        classic 4x MLP; a multiple of 64 keeps matmul shapes friendly to vectorised kernels."""
        return self.ffn_hidden if self.ffn_hidden is not None else 64 * -(-int(8 * self.n_embd / 3) // 64)

    @property
    def value_embedding_layers(self) -> range:
        """Every other layer, ending with the last (nanochat's choice), or none. A range, so that
        counting them (the size check) costs nothing whatever ``n_layer`` a config asks for."""
        return range((self.n_layer - 1) % 2, self.n_layer, 2) if self.value_embeddings else range(0)

    def num_params(self) -> int:
        """Parameters of a GPT of this shape (a tied head counted once), from the sizes alone:
        checking that a model fits must not build one, not even on the meta device, whose
        initialisers import torch's compiler (seconds at start-up)."""
        C = self.n_embd
        attention = C * (self.n_head + 2 * self.n_kv_head) * self.head_dim + C * C
        if self.attention == "mla":  # LatentAttention's matrices and latent norm gains
            r, q, rope = self.kv_latent_dim, self.q_latent_dim, self.rope_dim
            query_width = C + self.n_head * rope  # each head's query, and its rotary part
            query = C * query_width if q is None else C * q + q + q * query_width
            attention = query + C * (r + rope) + r + r * 2 * C + C * C
        per_layer = attention + 3 * C * self.ffn_dim + 2 * C
        head = 0 if self.tie_embeddings else self.vocab_size * C
        kv_width = self.n_kv_head * self.head_dim
        values = len(self.value_embedding_layers) * (self.vocab_size * kv_width + C * self.n_kv_head)
        positions = self.block_size * C if self.positions == "learned" else 0
        return self.vocab_size * C + positions + self.n_layer * per_layer + C + head + values

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _expect(condition: bool, what: str) -> None:
    require(condition, f"invalid GPTConfig: {what}", ValueError)
