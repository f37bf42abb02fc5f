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
        state |= {f"{prefix}self_attn.{name}": weight for name, weight in _attention_weights(block.attn, cfg).items()}
        state |= {f"{prefix}mlp.{name}": weight for name, weight in _mlp_weights(block.ffn, cfg).items()}
        state |= {
            prefix + "input_layernorm.weight": block.attn_norm.weight,
            prefix + "self_attn.o_proj.weight": block.attn.proj.weight,
            prefix + "post_attention_layernorm.weight": block.ffn_norm.weight,
        }
    return {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}


def _mlp_weights(ffn: torch.nn.Module, cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """A block's feed-forward matrices under the shipped names, SwiGLU's fused gate/up split."""
    if cfg.mlp == "relu2":
        return {"up_proj.weight": ffn.up.weight, "down_proj.weight": ffn.down.weight}
    gate, up = ffn.gate_up.weight.chunk(2)
    return {"gate_proj.weight": gate, "up_proj.weight": up, "down_proj.weight": ffn.down.weight}


def _attention_weights(attn: torch.nn.Module, cfg: GPTConfig) -> dict[str, torch.Tensor]:
    """A block's attention input matrices, split from our fused ones, under the shipped names,
    and QK-norm's gains."""
    norms = {"q_norm.weight": attn.q_head_norm.weight, "k_norm.weight": attn.k_head_norm.weight} if cfg.qk_norm else {}
    gate = {"value_gate.weight": attn.value_gate.weight} if hasattr(attn, "value_gate") else {}
    return norms | gate | _projection_weights(attn, cfg)


def _projection_weights(attn: torch.nn.Module, cfg: GPTConfig) -> dict[str, torch.Tensor]:
    d = cfg.head_dim
    if cfg.attention != "mla":
        q, k, v = attn.qkv.weight.split([cfg.n_head * d, cfg.n_kv_head * d, cfg.n_kv_head * d])
        return {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v}
    # kv_a_proj gives the latent and, with rotary positions, the shared rotary key after it.
    query, latent = attn.down.weight.split([attn.q_down_dim, cfg.kv_latent_dim + cfg.rope_dim])
    w_uk, w_uv = attn.kv_up.weight.chunk(2)
    weights = {"kv_a_proj.weight": latent, "kv_a_layernorm.weight": attn.kv_norm.weight,
               "k_b_proj.weight": w_uk, "v_b_proj.weight": w_uv}
    if cfg.q_latent_dim is None:
        return weights | {"q_proj.weight": query}
    return weights | {"q_a_proj.weight": query, "q_a_layernorm.weight": attn.q_norm.weight,
                      "q_b_proj.weight": attn.q_up.weight}
