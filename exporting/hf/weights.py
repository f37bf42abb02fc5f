"""Our weights under the names and shapes of the shipped transformers model.

Our fused Q/K/V and gate/up matrices are split as the model's layer map says (``model.layer_map``)
into transformers' usual separate projections, which tools such as PEFT target by name; latent
attention's into DeepSeek-style names (``kv_a_proj``, ``k_b_proj``, ``v_b_proj``, ``q_a_proj``,
``q_b_proj``)."""

import torch

from model.config import GPTConfig
from model.gpt import GPT
from model.layer_map import block_linears


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


def _attention_extras(attn: torch.nn.Module, cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """A block's attention weights that are not projections: the value gate and latent attention's norms."""
    weights = {}
    if hasattr(attn, "value_gate"):
        weights["value_gate.weight"] = attn.value_gate.weight
    if cfg.attention == "mla":
        weights["kv_a_layernorm.weight"] = attn.kv_norm.weight
        if cfg.q_latent_dim is not None:
            weights["q_a_layernorm.weight"] = attn.q_norm.weight
    return weights
