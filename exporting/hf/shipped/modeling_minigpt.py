"""A minigpt model for Hugging Face transformers: ``AutoModelForCausalLM``, ``generate``, pipelines.

Shipped inside every exported folder and loaded with ``trust_remote_code=True``; it depends on
torch and transformers only. No built-in transformers architecture combines learned absolute
positions with RMSNorm, SwiGLU and grouped-query (or multi-head latent) attention, hence this file.
Each block is pre-norm: x + attention(norm(x)), then x + mlp(norm(x)). A sequence past the learned
positions is an error with the fix in the message, never a silent wrap-around.

``generate`` passes the KV cache as ``past_key_values`` before transformers 5 and as ``cache``
since, and reads it back from the output's field of that name: ``forward`` accepts both, and the
outputs are built positionally, so nothing here reads the version of transformers.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_minigpt import MiniGPTConfig


class MiniGPTRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 even for half-precision weights: the mean of squares loses too much in bf16.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rotary_dim(config: MiniGPTConfig) -> int:
    """The numbers of each query and key head that rotary positions turn: the whole head, or for
    latent attention a decoupled part of half a head beside it; 0 without rotary positions."""
    if config.positions != "rope":
        return 0
    head_dim = config.hidden_size // config.num_attention_heads
    return head_dim // 2 if config.attention == "mla" else head_dim


def rotary_angles(position_ids: torch.Tensor, dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (batch or 1, 1, length, dim) of the angles position·base^(-2i/dim), each twice."""
    frequencies = 1.0 / base ** (torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32) / dim)
    angles = position_ids[..., None].float() * frequencies
    angles = torch.cat((angles, angles), dim=-1)[:, None]
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Each pair (x_i, x_{i+dim/2}) of x (batch, heads, length, dim) turned by its position's angle."""
    cos, sin = rotation
    first, second = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


class MiniGPTAttention(nn.Module):
    """Causal attention in which groups of query heads share one key/value head."""

    def __init__(self, config: MiniGPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        if value_embedding_layer(config, layer_idx):
            self.value_gate = nn.Linear(config.hidden_size, self.num_kv_heads, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: Cache | None,
                value_embedding: torch.Tensor | None = None, rotation=None) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x)
        if value_embedding is not None:  # the token's value embedding, gated per key/value head
            gate = 2 * torch.sigmoid(self.value_gate(x)).unsqueeze(-1)
            v = v + (gate * value_embedding.view(batch, length, self.num_kv_heads, self.head_dim)).flatten(2)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rotation is not None:  # rotary positions: the cache stores keys rotated at their positions
            q, k = rotate(q, rotation), rotate(k, rotation)
        if cache is not None:  # the cache stores the key/value heads, not their copies
            k, v = cache.update(k, v, self.layer_idx)
        group = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(batch, length, -1))


class MiniGPTLatentAttention(nn.Module):
    """Multi-head latent attention: every head's key and value are read from one latent per token,
    ``c = norm(kv_a_proj(x))``, and the cache stores only ``c`` (as its keys, with empty values).
    With rotary positions ``kv_a_proj`` also gives one rotary key per token, kept rotated beside the
    latent, and each query head has a rotary part (DeepSeek-V2's decoupled key). Keys and values are
    expanded from the latents at every call: the plainest form, equal to the "absorbed" one."""

    def __init__(self, config: MiniGPTConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.kv_latent_dim = config.kv_latent_dim
        self.rope_dim = rotary_dim(config)
        width = self.num_heads * self.head_dim
        query_width = self.num_heads * (self.head_dim + self.rope_dim)
        if config.q_latent_dim is None:
            self.q_proj = nn.Linear(config.hidden_size, query_width, bias=False)
        else:
            self.q_a_proj = nn.Linear(config.hidden_size, config.q_latent_dim, bias=False)
            self.q_a_layernorm = MiniGPTRMSNorm(config.q_latent_dim, config.rms_norm_eps)
            self.q_b_proj = nn.Linear(config.q_latent_dim, query_width, bias=False)
        self.kv_a_proj = nn.Linear(config.hidden_size, config.kv_latent_dim + self.rope_dim, bias=False)
        self.kv_a_layernorm = MiniGPTRMSNorm(config.kv_latent_dim, config.rms_norm_eps)
        self.k_b_proj = nn.Linear(config.kv_latent_dim, width, bias=False)
        self.v_b_proj = nn.Linear(config.kv_latent_dim, width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, past_key_values: Cache | None,
                value_embedding: None = None, rotation=None) -> torch.Tensor:
        batch, length, _ = x.shape
        if hasattr(self, "q_proj"):
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(batch, length, self.num_heads, self.head_dim + self.rope_dim).transpose(1, 2)
        q, q_rope = q.split([self.head_dim, self.rope_dim], dim=-1)
        latent, k_rope = self.kv_a_proj(x).unsqueeze(1).split([self.kv_latent_dim, self.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)  # (batch, 1, length, kv_latent_dim)
        if rotation is not None:  # cached beside the latent, rotated at its position
            latent = torch.cat((latent, rotate(k_rope, rotation)), dim=-1)
        if past_key_values is not None:
            latent, _ = past_key_values.update(latent, latent[..., :0], self.layer_idx)
        total = latent.shape[2]
        latent, k_rope = latent.split([self.kv_latent_dim, self.rope_dim], dim=-1)
        k = self.k_b_proj(latent[:, 0]).view(batch, total, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_b_proj(latent[:, 0]).view(batch, total, self.num_heads, self.head_dim).transpose(1, 2)
        if rotation is not None:  # every head's score adds its rotary part's against the shared key
            q = torch.cat((q, rotate(q_rope, rotation)), dim=-1)
            k = torch.cat((k, k_rope.expand(batch, self.num_heads, total, self.rope_dim)), dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(batch, length, -1))


class MiniGPTMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: MiniGPTConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MiniGPTBlock(nn.Module):
    def __init__(self, config: MiniGPTConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = MiniGPTRMSNorm(config.hidden_size, config.rms_norm_eps)
        attention = MiniGPTLatentAttention if config.attention == "mla" else MiniGPTAttention
        self.self_attn = attention(config, layer_idx)
        self.post_attention_layernorm = MiniGPTRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MiniGPTMLP(config)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, cache: Cache | None,
                value_embedding: torch.Tensor | None = None, rotation=None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), mask, cache, value_embedding, rotation)
        return x + self.mlp(self.post_attention_layernorm(x))


def value_embedding_layer(config: MiniGPTConfig, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` has value embeddings: every other layer, ending with the last."""
    return config.value_embeddings and layer_idx % 2 == (config.num_hidden_layers - 1) % 2


def attention_mask_4d(
    attention_mask: torch.Tensor | None, batch: int, length: int, past: int, device: torch.device
) -> torch.Tensor:
    """Boolean (batch, 1, length, past + length) mask, True where a query may read a key: causal,
    aligned to the bottom right, padding keys hidden. A padding query still reads itself: one that
    reads nothing is NaN, which leaks into real rows once its position is read from the cache."""
    total = past + length
    query = torch.arange(past, total, device=device).unsqueeze(1)
    key = torch.arange(total, device=device).unsqueeze(0)
    allowed = (key <= query).expand(batch, 1, length, total)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, -total:].bool()
        allowed = allowed | (key == query)
    return allowed


class MiniGPTPreTrainedModel(PreTrainedModel):
    config_class = MiniGPTConfig
    base_model_prefix = "model"
    _no_split_modules = ["MiniGPTBlock"]


class MiniGPTModel(MiniGPTPreTrainedModel):
    """Token (+ learned position) embeddings, the blocks, and the final norm (no LM head)."""

    def __init__(self, config: MiniGPTConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.positions == "learned":
            self.embed_positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList(MiniGPTBlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = MiniGPTRMSNorm(config.hidden_size, config.rms_norm_eps)
        kv_width = config.num_key_value_heads * config.hidden_size // config.num_attention_heads
        layers = [i for i in range(config.num_hidden_layers) if value_embedding_layer(config, i)]
        self.value_embeds = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, kv_width) for i in layers})
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        cache: Cache | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        cache = self._cache_for(cache, past_key_values, use_cache)
        batch, length = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            if attention_mask is not None:  # left padding: each row's first real token is position 0
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -length:]
            else:
                position_ids = torch.arange(past, past + length, device=input_ids.device).unsqueeze(0)
        x = self.embed_tokens(input_ids)
        if self.config.positions == "learned":
            self._check_positions(position_ids)
            x = x + self.embed_positions(position_ids)
        rotation = None
        if self.config.positions == "rope":  # computed once, turned by every layer's attention
            rotation = rotary_angles(position_ids, rotary_dim(self.config), self.config.rotary_base)
        mask = attention_mask_4d(attention_mask, batch, length, past, input_ids.device)
        for i, layer in enumerate(self.layers):
            value_embedding = self.value_embeds[str(i)](input_ids) if str(i) in self.value_embeds else None
            x = layer(x, mask, cache, value_embedding, rotation)
        return BaseModelOutputWithPast(self.norm(x), cache)

    def _cache_for(self, cache: Cache | None, past_key_values: Cache | None, use_cache: bool | None) -> Cache | None:
        """The cache to read and extend: the one passed under either name, a new one, or None."""
        if not (self.config.use_cache if use_cache is None else use_cache):
            return None
        cache = past_key_values if cache is None else cache
        return DynamicCache() if cache is None else cache

    def _check_positions(self, position_ids: torch.Tensor) -> None:
        limit = self.config.max_position_embeddings
        highest = int(position_ids.max())
        if highest >= limit:
            raise ValueError(
                f"position {highest} is past this model's {limit} learned positions (0..{limit - 1}): "
                f"keep the prompt plus max_new_tokens within {limit} tokens, or crop the prompt to "
                f"its last tokens"
            )


class MiniGPTForCausalLM(MiniGPTPreTrainedModel, GenerationMixin):
    # The LM head is the token embedding matrix (config.tie_word_embeddings); only the
    # embedding is stored, and transformers ties the head to it on load.
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: MiniGPTConfig):
        super().__init__(config)
        self.model = MiniGPTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    # The input embeddings are found through base_model_prefix ("model").
    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        logits_to_keep: int = 0,
        cache: Cache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits for ``input_ids``; with ``labels`` (usually the input ids, -100 = ignore), also
        the mean next-token cross-entropy (the shift by one happens here)."""
        cache = self.model._cache_for(cache, past_key_values, use_cache)
        out = self.model(input_ids, attention_mask, position_ids, cache=cache, use_cache=cache is not None)
        hidden = out.last_hidden_state
        # generate() asks for the last position only: the head is often the largest matmul.
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss, logits, cache)
