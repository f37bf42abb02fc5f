"""The model section as the user wrote it, explained: one line per refusal, naming the key and the fix;
and which of its options keep a model from being a Llama (``llama_blockers``).

``GPTConfig.from_dict`` (the model section of a training config, a run's ``model_config.json``)
calls ``explain_model_values`` on the section's type-checked values before building the config, so a
user never meets ``GPTConfig``'s own plain checks, which are there for programmer errors.
"""

from __future__ import annotations

import math
from typing import Any

from common.config import require

POSITIVE_INTS = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden")
ATTENTION_KINDS = ("gqa", "mla")
POSITION_KINDS = ("learned", "rope", "none")

# Bounds on the float keys beyond which a model computes nonsense in fp32 or cannot learn, while
# training runs on and blames the learning rate. rope_theta: at 1 or below every pair of a head
# turns a radian or more per token, and towards 1e-37 the inverse frequencies overflow fp32 to
# NaN; above 1e12 (LLaMA 3 uses 5e5, long-context models up to a few 1e9) the GGUF export's fp32
# is still fine, but no window tells the slow pairs from no rotation. norm_eps: above 1e-2 it
# outweighs the mean square of the embeddings at initialisation (about 4e-4), so the norms stop
# normalising and the gradients vanish; below 1e-12 (BERT's, the smallest in use) it is lost next
# to any activation.
ROPE_THETA_MAX = 1e12
NORM_EPS_RANGE = (1e-12, 1e-2)


def explain_model_values(v: dict[str, Any]) -> None:
    """Raise ConfigError for the first value of the model section ``v`` (every field, typed) that no
    model can be built from."""
    for name in POSITIVE_INTS:
        value = v[name]
        require(value is None or value >= 1, f"{name} must be a positive integer, got {value}; set it to at least 1")
    require(v["n_embd"] % v["n_head"] == 0, f"n_embd ({v['n_embd']}) must be divisible by n_head "
            f"({v['n_head']}); pick n_head from the divisors of n_embd or change n_embd")
    require(v["n_head"] % v["n_kv_head"] == 0, f"n_head ({v['n_head']}) must be divisible by n_kv_head "
            f"({v['n_kv_head']}); set n_kv_head to a divisor of n_head (1 = multi-query, n_head = multi-head)")
    _explain_attention(v)
    _explain_positions(v)
    require(0.0 <= v["dropout"] < 1.0, f"dropout must be in [0, 1), got {v['dropout']}; use 0.0 to disable it")
    low, high = NORM_EPS_RANGE
    require(low <= v["norm_eps"] <= high, f"norm_eps must be between {low:g} and {high:g}, got {v['norm_eps']}; "
            f"the default is 1e-5")
    require(not (v["value_embeddings"] and v["attention"] == "mla"), "value_embeddings needs attention gqa "
            "(multi-head latent attention caches only the latent, not the gated values); set "
            "value_embeddings: false to use mla (configs/tiny.yaml turns it on)")


def llama_blockers(config: Any) -> list[str]:
    """Each option that keeps ``config`` (a ``GPTConfig``) from being a Llama model, as ``model.key is X (set Y)``;
    empty for a Llama-shaped run.

    Llama's block is ours with every option at its plain setting: rotary positions over the halves
    of each head (transformers' convention, which ``model.gpt.rotary`` follows), grouped-query
    attention, RMSNorm, a SwiGLU feed-forward, no biases, and a tied or untied head. An option that
    changes what the model computes has no counterpart there; ``dropout`` only shapes training and
    does not matter. The Llama and GGUF exports refuse by it, and train.py offers
    them by it."""
    blockers = []
    if config.positions != "rope":
        blockers.append(f"model.positions is {config.positions} (Llama rotates queries and keys: set rope)")
    if config.attention != "gqa":
        blockers.append(f"model.attention is {config.attention} (set gqa)")
    if config.value_embeddings:
        blockers.append("model.value_embeddings is true (set false)")
    return blockers


def _explain_attention(v: dict[str, Any]) -> None:
    kind = v["attention"]
    require(kind in ATTENTION_KINDS, f"attention must be one of {', '.join(ATTENTION_KINDS)}, "
            f"got {kind!r}; use gqa (grouped-query) or mla (multi-head latent)")
    for name in ("kv_latent_dim", "q_latent_dim"):
        value = v[name]
        if kind != "mla":
            require(value is None, f"{name} is set ({value}) but attention is {kind!r}; "
                    f"remove {name} or set attention: mla")
        else:
            require(value is None or value >= 1, f"{name} must be a positive integer, got {value}; "
                    f"set it to at least 1")
    if kind == "mla":
        require(v["kv_latent_dim"] is not None, "attention mla needs kv_latent_dim, the width of the "
                "cached key/value latent; set it (e.g. kv_latent_dim: 64)")
        require(v["n_kv_head"] == v["n_head"], f"attention mla gives every head its own key and value "
                f"(read from the shared latent), so n_kv_head must equal n_head ({v['n_head']}), "
                f"got {v['n_kv_head']}; set n_kv_head: {v['n_head']}")


def _explain_positions(v: dict[str, Any]) -> None:
    kind = v["positions"]
    require(kind in POSITION_KINDS, f"positions must be one of {', '.join(POSITION_KINDS)}, got {kind!r}; "
            f"use learned (the default), rope (rotary) or none (the causal mask alone)")
    theta = v["rope_theta"]
    require(1.0 < theta <= ROPE_THETA_MAX, f"rope_theta must be above 1 and at most "
            f"{ROPE_THETA_MAX:g}, got {theta}; the default is 10000 (LLaMA 3 uses 500000)")
    if kind != "rope":
        return
    head_dim = v["n_embd"] // v["n_head"]
    if v["attention"] == "mla":  # the decoupled rotary part of each head: half of it (GPTConfig.rope_dim)
        require(head_dim % 4 == 0, f"positions rope with attention mla rotates half of each head "
                f"(n_embd / n_head = {head_dim}), which must be even, so head_dim must be a multiple of 4; "
                f"change n_embd or n_head")
    else:
        require(head_dim % 2 == 0, f"positions rope rotates pairs of numbers, so the head dimension "
                f"(n_embd / n_head = {head_dim}) must be even; change n_embd or n_head")
