"""Our weights under the names and shapes of the shipped transformers model.

The fused matrices are split: our attention computes Q, K and V in one matmul and our SwiGLU the
gate and up projections in one, while the export keeps transformers' usual separate ``q_proj``,
``k_proj``, ``v_proj``, ``gate_proj`` and ``up_proj``, which tools such as PEFT target by name.
"""

from __future__ import annotations

import torch

from model import GPT


def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """The export's tensors (CPU, contiguous, the model's dtype), keyed as ``MiniGPTForCausalLM``
    names them. A tied LM head is left out: the shipped config declares the tie."""
    cfg = model.config
    d = cfg.head_dim
    state = {
        "model.embed_tokens.weight": model.tok_emb.weight,
        "model.embed_positions.weight": model.pos_emb.weight,
        "model.norm.weight": model.norm.weight,
    }
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = model.lm_head.weight
    for i, block in enumerate(model.blocks):
        prefix = f"model.layers.{i}."
        q, k, v = block.attn.qkv.weight.split([cfg.n_head * d, cfg.n_kv_head * d, cfg.n_kv_head * d])
        gate, up = block.ffn.gate_up.weight.chunk(2)
        state |= {
            prefix + "input_layernorm.weight": block.attn_norm.weight,
            prefix + "self_attn.q_proj.weight": q,
            prefix + "self_attn.k_proj.weight": k,
            prefix + "self_attn.v_proj.weight": v,
            prefix + "self_attn.o_proj.weight": block.attn.proj.weight,
            prefix + "post_attention_layernorm.weight": block.ffn_norm.weight,
            prefix + "mlp.gate_proj.weight": gate,
            prefix + "mlp.up_proj.weight": up,
            prefix + "mlp.down_proj.weight": block.ffn.down.weight,
        }
    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
