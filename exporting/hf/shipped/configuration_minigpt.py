"""Configuration of a minigpt model for Hugging Face transformers.

Shipped inside every exported folder and loaded with ``trust_remote_code=True``; it depends on
transformers only. Field names follow transformers' conventions so that generic tools (pipelines,
evaluation harnesses) find the sizes where they look for them.
"""

from transformers import PretrainedConfig


class MiniGPTConfig(PretrainedConfig):
    """A decoder-only GPT: learned absolute positions, RMSNorm, SwiGLU, grouped-query attention.

    ``max_position_embeddings`` is a hard limit: the position table has that many rows and nothing
    past them, so a sequence (prompt plus generated tokens) can never be longer.

    ``positions="rope"`` rotates each query and key head by its position instead (pairs of numbers
    (i, i + dim/2), wavelengths from ``rotary_base``), with no table and so no hard limit; for latent
    attention in a decoupled part of ``head_dim / 2`` numbers per head beside one shared rotary key
    per token, cached with the latent. ``positions="none"`` gives the model no positions at all.

    ``attention="mla"`` is multi-head latent attention instead: every head's key and value are read
    from one latent of ``kv_latent_dim`` numbers per token (the only thing the cache stores), and
    the query from a latent of ``q_latent_dim`` when that is set.

    ``value_embeddings`` (off by default): every other layer, ending with the last, adds its own
    embedding of each token to the attention values, under a gate ``2·sigmoid(value_gate(x))`` per
    key/value head.
    """

    model_type = "minigpt"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]  # the cache's name before and since transformers 5

    def __init__(
        self,
        vocab_size: int = 2048,
        hidden_size: int = 128,
        intermediate_size: int = 384,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        max_position_embeddings: int = 128,
        rms_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        use_cache: bool = True,
        tie_word_embeddings: bool = True,
        attention: str = "gqa",
        kv_latent_dim: int | None = None,
        q_latent_dim: int | None = None,
        value_embeddings: bool = False,
        positions: str = "learned",
        rotary_base: float = 10000.0,
        **kwargs,
    ):
        if hidden_size % num_attention_heads or num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"hidden_size ({hidden_size}) must be divisible by num_attention_heads "
                f"({num_attention_heads}), and that by num_key_value_heads ({num_key_value_heads})"
            )
        if attention not in ("gqa", "mla") or (attention == "mla") != (kv_latent_dim is not None):
            raise ValueError(f"attention must be 'gqa', or 'mla' with kv_latent_dim set; got {attention!r} "
                             f"with kv_latent_dim={kv_latent_dim}")
        if positions not in ("learned", "rope", "none"):
            raise ValueError(f"positions must be 'learned', 'rope' or 'none', got {positions!r}")
        self.positions = positions
        self.rotary_base = rotary_base
        self.value_embeddings = value_embeddings
        self.attention = attention
        self.kv_latent_dim = kv_latent_dim
        self.q_latent_dim = q_latent_dim
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

