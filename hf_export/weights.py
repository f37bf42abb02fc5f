"""Our weights under the names and shapes of the shipped transformers model.

The fused matrices are split: our attention computes Q, K and V in one matmul and our SwiGLU the
gate and up projections in one, while the export keeps transformers' usual separate ``q_proj``,
``k_proj``, ``v_proj``, ``gate_proj`` and ``up_proj``, which tools such as PEFT target by name.
Latent attention's matrices are split the same way, into DeepSeek-style names (``kv_a_proj`` down
to the latent, ``k_b_proj`` and ``v_b_proj`` up from it, ``q_a_proj``/``q_b_proj`` for the query).
"""

from __future__ import annotations

import torch

from model import GPT, GPTConfig


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The export's tensors (CPU, contiguous, the model's dtype), keyed as ``MiniGPTForCausalLM``
    names them. A tied LM head is left out: the shipped config declares the tie."""
    cfg = model.config
    state = {
        "model.embed_tokens.weight": model.tok_emb.weight,
        "model.embed_positions.weight": model.pos_emb.weight,
        "model.norm.weight": model.norm.weight,
    }
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = model.lm_head.weight
    for i, block in enumerate(model.blocks):
        prefix = f"model.layers.{i}."
        gate, up = block.ffn.gate_up.weight.chunk(2)
        state |= {f"{prefix}self_attn.{name}": weight for name, weight in _attention_weights(block.attn, cfg).items()}
        state |= {
            prefix + "input_layernorm.weight": block.attn_norm.weight,
            prefix + "self_attn.o_proj.weight": block.attn.proj.weight,
            prefix + "post_attention_layernorm.weight": block.ffn_norm.weight,
            prefix + "mlp.gate_proj.weight": gate,
            prefix + "mlp.up_proj.weight": up,
            prefix + "mlp.down_proj.weight": block.ffn.down.weight,
        }
    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}


def _attention_weights(attn: torch.nn.Module, cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """A block's attention input matrices, split from our fused ones, under the shipped names."""
    d = cfg.head_dim
    if cfg.attention != "mla":
        q, k, v = attn.qkv.weight.split([cfg.n_head * d, cfg.n_kv_head * d, cfg.n_kv_head * d])
        return {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v}
    query, latent = attn.down.weight.split([attn.down.out_features - cfg.kv_latent_dim, cfg.kv_latent_dim])
    w_uk, w_uv = attn.kv_up.weight.chunk(2)
    weights = {"kv_a_proj.weight": latent, "kv_a_layernorm.weight": attn.kv_norm.weight,
               "k_b_proj.weight": w_uk, "v_b_proj.weight": w_uv}
    if cfg.q_latent_dim is None:
        return weights | {"q_proj.weight": query}
    return weights | {"q_a_proj.weight": query, "q_a_layernorm.weight": attn.q_norm.weight,
                      "q_b_proj.weight": attn.q_up.weight}
