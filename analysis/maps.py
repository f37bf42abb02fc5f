"""Attention probabilities of a model for given token ids (with and without the 1/√d scale), the
head-role table of a run, and the words that name a run's attention kind.

The probabilities come from ``GPT.attention_weights``: each attention kind's own projections and
scores, the same code its forward pass runs, returned before they are applied to the values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from analysis.roles import (
    attention_entropy,
    induction_score,
    previous_token_score,
    repeated_random_tokens,
    sink_score,
)
from model import GPTConfig
from model.gpt import causal_attention_weights, eval_mode


@torch.no_grad()
def attention_maps(model: nn.Module, idx: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the (B, n_head, T, T) attention probabilities of ``model`` on ``idx`` (B, T),
    computed in eval mode (no dropout) and returned on the CPU in fp32."""
    with eval_mode(model):
        return [probs.float().cpu() for probs in model.attention_weights(idx)]


@dataclass(frozen=True)
class ScaleComparison:
    """One head's (T, T) attention over a sequence, as the model computes it (``softmax(q kᵀ / √d)``)
    and from the same scores without the 1/√d scale (``softmax(q kᵀ)``)."""

    scaled: torch.Tensor
    unscaled: torch.Tensor
    head_dim: int

    def entropy_bits(self) -> tuple[float, float]:
        """Mean entropy over queries of the scaled and the unscaled weights, in bits."""
        return float(attention_entropy(self.scaled)), float(attention_entropy(self.unscaled))


@torch.no_grad()
def scale_comparison(model: nn.Module, idx: torch.Tensor, layer: int, head: int) -> ScaleComparison:
    """Head ``head`` of layer ``layer`` on token ids ``idx`` (1, T), with and without the 1/√d scale.

    Both come from the layer's own queries and keys (``GPT.attention_queries_keys``) through the
    same masked softmax the maps use; only the scale differs. Dividing by √d multiplies every
    score by the same factor below 1, a softmax temperature above 1, so each scaled row is at
    least as spread out as the unscaled one.
    """
    with eval_mode(model):
        q, k = model.attention_queries_keys(idx)[layer]
    q, k = q[0, head:head + 1].float(), k[0, head:head + 1].float()
    return ScaleComparison(scaled=causal_attention_weights(q, k)[0].cpu(),
                           unscaled=causal_attention_weights(q, k, scale=1.0)[0].cpu(),
                           head_dim=q.shape[-1])


@dataclass(frozen=True)
class HeadRole:
    layer: int
    head: int
    previous_token: float
    sink: float
    entropy_bits: float
    induction: float


def head_roles(
    model: nn.Module, text_windows: torch.Tensor, *, induction_period: int | None = None, seed: int = 0
) -> list[HeadRole]:
    """Score every head of ``model``.

    Previous-token, sink and entropy are averaged over the (B, T) windows of held-out text;
    induction over random tokens repeated twice (half a window each, unless ``induction_period``),
    drawn from ids 1.. of the vocabulary with ``seed``.
    """
    config = model.config
    text = attention_maps(model, text_windows)
    period = induction_period or config.block_size // 2
    generator = torch.Generator().manual_seed(seed)
    repeats = repeated_random_tokens(text_windows.shape[0], period, config.vocab_size, generator, low=1)
    repeated = attention_maps(model, repeats.to(text_windows.device))
    roles = []
    for layer, (probs, probs_repeat) in enumerate(zip(text, repeated)):
        prev = previous_token_score(probs).mean(0)
        sink = sink_score(probs).mean(0)
        entropy = attention_entropy(probs).mean(0)
        induction = induction_score(probs_repeat, period).mean(0)
        for head in range(probs.shape[1]):
            roles.append(HeadRole(layer, head, float(prev[head]), float(sink[head]),
                                  float(entropy[head]), float(induction[head])))
    return roles


def format_roles(roles: list[HeadRole]) -> str:
    """A markdown table, one row per layer and head."""
    lines = ["| layer | head | previous-token | first-token (sink) | entropy (bits) | induction |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in roles:
        lines.append(f"| {r.layer} | {r.head} | {r.previous_token:.3f} | {r.sink:.3f} | "
                     f"{r.entropy_bits:.3f} | {r.induction:.3f} |")
    return "\n".join(lines)


def attention_summary(model: nn.Module, text_windows: torch.Tensor) -> dict[str, float]:
    """What training logs at each evaluation: each layer's mean attention entropy over
    ``text_windows`` and the best induction score of any head (``head_roles``' definitions)."""
    roles = head_roles(model, text_windows)
    summary = {}
    for layer in range(model.config.n_layer):
        heads = [r.entropy_bits for r in roles if r.layer == layer]
        summary[f"attn_entropy_layer{layer}"] = sum(heads) / len(heads)
    summary["induction_best"] = max(r.induction for r in roles)
    return summary


def describe_attention(config: GPTConfig) -> str:
    """The attention kind of a model config in words, as figures label a run: MHA, GQA or MQA by
    how many key/value heads the query heads share, MLA by the width of its cached latent."""
    if config.attention == "mla":
        query = f", query latent {config.q_latent_dim}" if config.q_latent_dim else ""
        return f"MLA, latent {config.kv_latent_dim}{query}"
    if config.n_kv_head == config.n_head:
        return f"MHA, {config.n_head} KV heads"
    if config.n_kv_head == 1:
        return "MQA, 1 KV head"
    return f"GQA, {config.n_kv_head} KV heads"
