"""The Llama weights under GGUF's names, with the query and key rows reordered for llama.cpp.

Ours and transformers' Llama rotate the pair (i, i + d/2) of a head; llama.cpp's llama
architecture rotates the neighbours (2i, 2i + 1), at the same frequency. So each head's query and
key rows are interleaved (row i to 2i, row i + d/2 to 2i + 1), as Hugging Face's own converter
does: a dot product is the same sum in any order of its numbers, so the scores are unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from model.config import GPTConfig

# Transformers' Llama layer names (as ``exporting.hf.weights`` writes them) -> GGUF's, per block.
_BLOCK_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_TOP_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_tensors(llama_weights: dict[str, torch.Tensor], config: GPTConfig) -> dict[str, np.ndarray]:
    """Every tensor of ``llama_weights`` as float32 numpy under its GGUF name, query and key rows
    interleaved. A tied head has no ``output.weight``: llama.cpp then reads the token embedding."""
    tensors = {}
    for name, tensor in llama_weights.items():
        array = tensor.detach().to(torch.float32).numpy()
        module = name.removesuffix(".weight")
        if module in _TOP_NAMES:
            tensors[f"{_TOP_NAMES[module]}.weight"] = array
            continue
        _, _, layer, inner = module.split(".", 3)  # model.layers.{i}.{inner}
        gguf_name = _BLOCK_NAMES[inner]
        if gguf_name in ("attn_q", "attn_k"):
            heads = config.n_head if gguf_name == "attn_q" else config.n_kv_head
            array = interleave_halves(array, heads)
        tensors[f"blk.{layer}.{gguf_name}.weight"] = array
    return tensors


def interleave_halves(weight: np.ndarray, heads: int) -> np.ndarray:
    """``weight`` (heads·d, in) with each head's rows (first half, second half) reordered to
    (h0[0], h1[0], h0[1], h1[1], ...): from transformers' rotary pairs to llama.cpp's."""
    rows, columns = weight.shape
    half = rows // heads // 2
    return np.ascontiguousarray(weight.reshape(heads, 2, half, columns).swapaxes(1, 2).reshape(rows, columns))
