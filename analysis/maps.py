"""What ``attention.py`` reads from a model's attention (``analysis.roles``): head roles, copy scores,
the scale's effect, the attention kind in words."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from analysis.roles import (
    attention_entropy,
    attention_maps,
    copy_score,
    induction_score,
    previous_token_score,
    probe_ids,
    probe_induction,
    repeat_probe,
    sink_score,
)
from model.config import GPTConfig
from model.gpt import causal_attention_weights, eval_mode


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
    """Head ``head`` of layer ``layer`` on token ids ``idx`` (1, T), with and without the 1/√d
    scale, from the layer's own queries and keys through the maps' masked softmax."""
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
    model: nn.Module, text_windows: torch.Tensor, ids: torch.Tensor | None = None, *, seed: int = 0
) -> list[HeadRole]:
    """Score every head of ``model``: previous-token, sink and entropy over the (B, T) windows of
    held-out text; induction over ``repeat_probe``'s sequences drawn from ``ids`` (default: every id
    in ``text_windows``), NaN with no period to probe at."""
    text = attention_maps(model, text_windows)
    if ids is None:
        ids = probe_ids(text_windows.cpu().numpy(), min_count=1)
    probe = repeat_probe(ids, model.config.block_size, seed=seed)
    induction = (probe_induction(model, probe, text_windows.device) if probe
                 else [torch.full((probs.shape[1],), math.nan) for probs in text])
    roles = []
    for layer, probs in enumerate(text):
        prev = previous_token_score(probs).mean(0)
        sink = sink_score(probs).mean(0)
        entropy = attention_entropy(probs).mean(0)
        for head in range(probs.shape[1]):
            roles.append(HeadRole(layer, head, float(prev[head]), float(sink[head]),
                                  float(entropy[head]), float(induction[layer][head])))
    return roles


def layer_induction(roles: list[HeadRole]) -> list[float]:
    """Per layer, the sum of its heads' induction scores: copying spread over several heads shows
    here before any one head carries it alone."""
    sums = [0.0] * (max(r.layer for r in roles) + 1)
    for r in roles:
        sums[r.layer] += r.induction
    return sums


def format_roles(roles: list[HeadRole]) -> str:
    """A markdown table, one row per layer and head, then each layer's summed induction score."""
    lines = ["| layer | head | previous-token | first-token (sink) | entropy (bits) | induction |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in roles:
        lines.append(f"| {r.layer} | {r.head} | {r.previous_token:.3f} | {r.sink:.3f} | "
                     f"{r.entropy_bits:.3f} | {r.induction:.3f} |")
    lines += ["", "| layer | induction, summed over heads |", "|---:|---:|"]
    lines += [f"| {layer} | {total:.3f} |" for layer, total in enumerate(layer_induction(roles))]
    return "\n".join(lines)


@dataclass(frozen=True)
class SpanRepeat:
    """A span of ``length`` tokens at ``offset`` of a sequence, written again ``period`` later."""

    offset: int
    period: int
    length: int


def find_repeat(ids: Sequence[int], span: Sequence[int]) -> SpanRepeat | None:
    """The first two places ``span`` occurs in ``ids``, not overlapping (None: it does not occur twice)."""
    n = len(span)
    starts = []
    for i in range(len(ids) - n + 1):
        if list(ids[i:i + n]) == list(span) and (not starts or i >= starts[0] + n):
            starts.append(i)
            if len(starts) == 2:
                return SpanRepeat(starts[0], starts[1] - starts[0], n)
    return None


@dataclass(frozen=True)
class CopyRole:
    layer: int
    head: int
    copy: float
    induction: float


def copy_roles(model: nn.Module, idx: torch.Tensor, repeat: SpanRepeat) -> list[CopyRole]:
    """Every head's copy and induction scores (``analysis.roles``) at ``repeat``'s positions of the
    sequence ``idx`` (1, T)."""
    roles = []
    for layer, probs in enumerate(attention_maps(model, idx)):
        copy = copy_score(probs[0], repeat.period, repeat.offset, repeat.length)
        induction = induction_score(probs[0], repeat.period, repeat.offset, repeat.length)
        roles += [CopyRole(layer, head, float(copy[head]), float(induction[head])) for head in range(len(copy))]
    return roles


def format_copy_roles(roles: list[CopyRole]) -> str:
    lines = ["| layer | head | copy | induction |", "|---:|---:|---:|---:|"]
    lines += [f"| {r.layer} | {r.head} | {r.copy:.3f} | {r.induction:.3f} |" for r in roles]
    return "\n".join(lines)


def describe_attention(config: GPTConfig) -> str:
    """The attention kind of a model config in words, as figures label a run, then its positions
    unless they are the default learned ones."""
    positions = {"learned": "", "rope": ", rotary positions", "none": ", no positions"}[config.positions]
    return _describe_heads(config) + positions


def _describe_heads(config: GPTConfig) -> str:
    if config.attention == "mla":
        query = f", query latent {config.q_latent_dim}" if config.q_latent_dim else ""
        return f"MLA, latent {config.kv_latent_dim}{query}"
    if config.n_kv_head == config.n_head:
        return f"MHA, {config.n_head} KV heads"
    if config.n_kv_head == 1:
        return "MQA, 1 KV head"
    return f"GQA, {config.n_kv_head} KV heads"
