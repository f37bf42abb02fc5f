"""The model's layer map: which linear layers a block has (``model.gpt.Block``), and how a fused
one splits into the projections it computes at once. The Hugging Face export splits the weights by
it (``exporting.hf.weights``) and LoRA adapts its layers and writes the adapter by it
(``training.lora``): neither decides what a block holds."""

from dataclasses import dataclass

from model.config import GPTConfig


@dataclass(frozen=True)
class LinearPart:
    """Rows of a block's matrix that act as one projection. ``name`` is that projection's name in
    the Llama family's layout (DeepSeek's for latent attention): the name the Hugging Face export
    ships it under and a PEFT adapter targets, so that both speak the same language."""

    name: str
    rows: int  # how many output rows of the matrix it takes, in order


@dataclass(frozen=True)
class BlockLinear:
    """One linear layer of ``Block``; a fused matrix's rows split between its parts, in order."""

    in_features: int
    parts: tuple[LinearPart, ...]

    @property
    def out_features(self) -> int:
        return sum(part.rows for part in self.parts)


def block_linears(cfg: GPTConfig) -> dict[str, BlockLinear]:
    """Every projection of a block (the value gate aside) by its module name (``attn.qkv``,
    ``ffn.gate_up``, ...), and the parts its rows hold: one matmul for Q, K and V, or for the gate
    and up projections, is several projections to an export or an adapter."""
    width, kv_width = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim

    def linear(in_features: int, *parts: tuple[str, int]) -> BlockLinear:
        return BlockLinear(in_features, tuple(LinearPart(name, rows) for name, rows in parts))

    if cfg.attention == "mla":
        # With rotary positions each query head carries its rotary part after it, and ``down`` gives
        # the shared rotary key after the latent.
        r, q, query_width = cfg.kv_latent_dim, cfg.q_latent_dim, cfg.n_head * (cfg.head_dim + cfg.rope_dim)
        query = ("self_attn.q_proj", query_width) if q is None else ("self_attn.q_a_proj", q)
        layers = {"attn.down": linear(cfg.n_embd, query, ("self_attn.kv_a_proj", r + cfg.rope_dim))}
        if q is not None:
            layers["attn.q_up"] = linear(q, ("self_attn.q_b_proj", query_width))
        layers["attn.kv_up"] = linear(r, ("self_attn.k_b_proj", width), ("self_attn.v_b_proj", width))
    else:
        layers = {"attn.qkv": linear(cfg.n_embd, ("self_attn.q_proj", width), ("self_attn.k_proj", kv_width),
                                     ("self_attn.v_proj", kv_width))}
    layers["attn.proj"] = linear(width, ("self_attn.o_proj", cfg.n_embd))
    layers["ffn.gate_up"] = linear(cfg.n_embd, ("mlp.gate_proj", cfg.ffn_dim), ("mlp.up_proj", cfg.ffn_dim))
    layers["ffn.down"] = linear(cfg.ffn_dim, ("mlp.down_proj", cfg.n_embd))
    return layers
