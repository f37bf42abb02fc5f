"""Configuration of a minigpt model for Hugging Face transformers, shipped in every exported
folder. Field names follow transformers' conventions so that generic tools find the sizes."""

from transformers import PretrainedConfig


class MiniGPTConfig(PretrainedConfig):
    """A decoder-only GPT: RMSNorm, SwiGLU, grouped-query attention (``attention="mla"``: multi-head
    latent attention, from a latent of ``kv_latent_dim``, the query from one of ``q_latent_dim`` when
    set), learned positions up to ``max_position_embeddings`` (``positions="rope"``: rotary, base
    ``rotary_base``; ``"none"``), and optional ``value_embeddings`` (see modeling_minigpt.py)."""

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

