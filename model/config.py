"""The model's configuration: its sizes and options, each declared with its bounds, and the rules
across them that refuse what no model can be built from, in one line naming the key. ``model.gpt``
builds the network from it."""

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from common.config import Removed, Section, build, require

# Bounds beyond which a model computes nonsense in fp32 or cannot learn, while training runs on and
# blames the learning rate. rope_theta: at 1 or below every pair of a head turns a radian or more per
# token; above 1e12 (LLaMA 3 uses 5e5, long-context models up to a few 1e9) no window tells the slow
# pairs from no rotation. norm_eps: above 1e-2 it outweighs the mean square of the embeddings at
# initialisation, so the norms stop normalising; below 1e-12 (BERT's, the smallest in use) it is lost
# next to any activation.
ROPE_THETA_MAX = 1e12
POSITION_KINDS = ("learned", "rope", "none")


class GPTConfig(Section):
    """Sizes of a decoder-only GPT, and its options (docs/training.md), the attention and position kinds
    side by side in ``model.gpt``. Served decoding is batch-invariant on the CPU when ``head_dim`` (or
    ``kv_latent_dim``, plus ``rope_dim`` with rotary positions) is a multiple of 16
    (``CausalSelfAttention._attend_token``)."""

    vocab_size: int = Field(ge=1)
    block_size: int = Field(ge=1)
    n_layer: int = Field(ge=1)
    n_head: int = Field(ge=1)
    n_kv_head: int = Field(ge=1, description="1: multi-query attention; n_head: multi-head")
    n_embd: int = Field(ge=1)
    ffn_hidden: int | None = Field(None, ge=1, description="null: derived from n_embd (ffn_dim)")
    dropout: float = Field(0.0, ge=0, lt=1)
    norm_eps: float = Field(1e-5, ge=1e-12, le=1e-2)
    tie_embeddings: bool = True
    attention: Literal["gqa", "mla"] = Field("gqa", description="grouped-query, or multi-head latent attention")
    kv_latent_dim: int | None = Field(None, ge=1, description="mla only: the cached latent's width")
    q_latent_dim: int | None = Field(None, ge=1, description="mla only: the queries' latent (null: none)")
    value_embeddings: bool = False
    positions: Literal[POSITION_KINDS] = "learned"
    rope_theta: float = Field(10000.0, gt=1, le=ROPE_THETA_MAX, description="rope's base; LLaMA 3 uses 500000")
    # Options that lost by the records (docs/records.md), at the value that turned them off (common.config).
    REMOVED_KEYS: ClassVar[dict[str, Removed]] = {
        "bigram_buckets": Removed(None), "mtp_weight": Removed(0.0), "mlp": Removed("swiglu"),
        "qk_norm": Removed(False), "logit_softcap": Removed(None), "residual_scalars": Removed(False),
        "zero_init": Removed(False)}

    @model_validator(mode="after")
    def _buildable(self) -> "GPTConfig":
        n_head, kind = self.n_head, self.attention
        require(self.n_embd % n_head == 0, f"n_embd ({self.n_embd}) must be divisible by n_head ({n_head}); "
                "pick n_head from the divisors of n_embd or change n_embd")
        require(n_head % self.n_kv_head == 0, f"n_head ({n_head}) must be divisible by n_kv_head ({self.n_kv_head}); "
                "set n_kv_head to a divisor of n_head (1 = multi-query, n_head = multi-head)")
        for name in ("kv_latent_dim", "q_latent_dim"):
            require(kind == "mla" or getattr(self, name) is None, f"{name} is set ({getattr(self, name)}) but "
                    f"attention is {kind!r}; remove {name} or set attention: mla")
        require(kind != "mla" or self.kv_latent_dim is not None, "attention mla needs kv_latent_dim, the width of "
                "the cached key/value latent; set it (e.g. kv_latent_dim: 64)")
        require(kind != "mla" or self.n_kv_head == n_head, f"attention mla gives every head its own key and value "
                f"(read from the shared latent), so n_kv_head must equal n_head ({n_head}), got {self.n_kv_head}; "
                f"set n_kv_head: {n_head}")
        # The gate that mixes a value embedding in reads the layer's input, which a latent-only
        # cache does not keep: cached positions could not be decoded again from the latent alone.
        require(not (self.value_embeddings and kind == "mla"), "value_embeddings needs attention gqa (multi-head "
                "latent attention caches only the latent, not the gated values); set value_embeddings: false to "
                "use mla (configs/tiny.yaml turns it on)")
        require(self.positions != "rope" or self.rope_dim % 2 == 0, f"positions rope rotates pairs of numbers, "
                f"so the rotated part of each head ({self.rope_dim} of n_embd / n_head = {self.head_dim}) must be "
                "even; change n_embd or n_head")
        return self

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GPTConfig":
        """The config of a model section written by a user (YAML, JSON): unknown, missing,
        mistyped and impossible values are refused in one line each."""
        return build(cls, d, "model")

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

    def llama_blockers(self) -> list[str]:
        """Each option that keeps this model from being a Llama, as ``model.key is X (set Y)``; empty
        for a Llama-shaped run (the Llama and GGUF exports, and the exports ``train.py`` suggests).

        Llama's block is ours with every option at its plain setting: rotary positions over the halves
        of each head (transformers' convention, which ``model.gpt.rotary`` follows), grouped-query
        attention, RMSNorm, a SwiGLU feed-forward, no biases, and a tied or untied head. An option that
        changes what the model computes has no counterpart there; ``dropout`` only shapes training."""
        blockers = []
        if self.positions != "rope":
            blockers.append(f"model.positions is {self.positions} (Llama rotates queries and keys: set rope)")
        if self.attention != "gqa":
            blockers.append(f"model.attention is {self.attention} (set gqa)")
        if self.value_embeddings:
            blockers.append("model.value_embeddings is true (set false)")
        return blockers

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
