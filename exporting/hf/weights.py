"""Our weights under the names and shapes of the shipped transformers model.

The fused matrices are split: our attention computes Q, K and V in one matmul and our SwiGLU the
gate and up projections in one, while the export keeps transformers' usual separate ``q_proj``,
``k_proj``, ``v_proj``, ``gate_proj`` and ``up_proj``, which tools such as PEFT target by name.
Latent attention's matrices are split the same way, into DeepSeek-style names (``kv_a_proj`` down
to the latent, ``k_b_proj`` and ``v_b_proj`` up from it, ``q_a_proj``/``q_b_proj`` for the query).
The options' weights: QK-norm's gains as ``self_attn.q_norm``/``k_norm`` (Qwen3's names), a ReLU²
MLP as ``up_proj``/``down_proj`` alone, the residual scalars as ``model.resid_lambdas``/``x0_lambdas``,
value embeddings as ``model.value_embeds.{layer}`` with their gates as ``self_attn.value_gate``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model import GPT, GPTConfig


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The export's tensors (CPU, contiguous, the model's dtype), keyed as ``MiniGPTForCausalLM``
    names them. A tied LM head is left out: the shipped config declares the tie."""
    cfg = model.config
    state = {
        "model.embed_tokens.weight": model.tok_emb.weight,
        "model.norm.weight": model.norm.weight,
    }
    if cfg.positions == "learned":
        state["model.embed_positions.weight"] = model.pos_emb.weight
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = model.lm_head.weight
    if cfg.residual_scalars:
        state |= {"model.resid_lambdas": model.resid_lambdas, "model.x0_lambdas": model.x0_lambdas}
    state |= {f"model.value_embeds.{i}.weight": table.weight for i, table in model.value_embs.items()}
    for i, block in enumerate(model.blocks):
        prefix = f"model.layers.{i}."
        for name, layer in block_linears(cfg).items():
            rows = block.get_submodule(name).weight.split([part.rows for part in layer.parts])
            state |= {f"{prefix}{part.name}.weight": weight for part, weight in zip(layer.parts, rows, strict=True)}
        state |= {f"{prefix}self_attn.{name}": weight for name, weight in _attention_extras(block.attn, cfg).items()}
        state |= {
            prefix + "input_layernorm.weight": block.attn_norm.weight,
            prefix + "post_attention_layernorm.weight": block.ffn_norm.weight,
        }
    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}


@dataclass(frozen=True)
class ShippedPart:
    name: str  # the shipped model's layer, under ``model.layers.{i}.``
    rows: int  # how many output rows of our matrix it takes, in order


@dataclass(frozen=True)
class BlockLinear:
    """One linear layer of our block as the shipped model's layers: a fused matrix's rows are
    split between several, in order."""

    in_features: int
    parts: tuple[ShippedPart, ...]

    @property
    def out_features(self) -> int:
        return sum(part.rows for part in self.parts)


def block_linears(cfg: GPTConfig) -> dict[str, BlockLinear]:
    """Every projection of a block (the value gate aside), by its name in ``model.gpt.Block``
    (``attn.qkv``, ``ffn.gate_up``, ...), with the shipped layers its rows become: the one map
    from our layer names to the export's, for the weights and for a LoRA adapter's."""
    width, kv_width = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim

    def linear(in_features: int, *parts: tuple[str, int]) -> BlockLinear:
        return BlockLinear(in_features, tuple(ShippedPart(name, rows) for name, rows in parts))

    if cfg.attention == "mla":
        # With rotary positions each query head carries its rotary part after it, and kv_a_proj gives
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
    if cfg.mlp == "swiglu":
        layers["ffn.gate_up"] = linear(cfg.n_embd, ("mlp.gate_proj", cfg.ffn_dim), ("mlp.up_proj", cfg.ffn_dim))
    else:
        layers["ffn.up"] = linear(cfg.n_embd, ("mlp.up_proj", cfg.ffn_dim))
    layers["ffn.down"] = linear(cfg.ffn_dim, ("mlp.down_proj", cfg.n_embd))
    return layers


def _attention_extras(attn: torch.nn.Module, cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """A block's attention weights that are not projections: QK-norm's gains, the value gate, and
    latent attention's norms."""
    weights = {"q_norm.weight": attn.q_head_norm.weight, "k_norm.weight": attn.k_head_norm.weight} if cfg.qk_norm else {}
    if hasattr(attn, "value_gate"):
        weights["value_gate.weight"] = attn.value_gate.weight
    if cfg.attention == "mla":
        weights["kv_a_layernorm.weight"] = attn.kv_norm.weight
        if cfg.q_latent_dim is not None:
            weights["q_a_layernorm.weight"] = attn.q_norm.weight
    return weights
