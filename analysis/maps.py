"""Attention probabilities of a model (``GPT.attention_weights``: the forward pass's own code), and
what is read from them: head roles, the repeated-sequence probe, copy scores, the attention kind in words."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from analysis.roles import (
    attention_entropy,
    copy_score,
    induction_score,
    previous_token_score,
    repeated_random_tokens,
    sink_score,
)
from model.config import GPTConfig
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


# The shortest repeat scored: shorter ones put the predicted token among so few earlier positions
# that a head spreading its weight evenly already scores high.
MIN_PERIOD = 8
# Ids looked for in at most this many held-out tokens: enough to meet every id a corpus uses
# often, and a bounded cost at each evaluation of a run on a large corpus.
PROBE_TOKENS = 1_000_000
# The probe draws only ids seen at least this often among those tokens: an id the model met a
# handful of times has an embedding training has barely moved. Held-out text holds a twentieth to
# a tenth of the training tokens, so each such id was trained on about a hundred times or more.
MIN_COUNT = 10


def probe_ids(tokens: np.ndarray, *, skip: Sequence[int] = (), min_count: int = MIN_COUNT) -> torch.Tensor:
    """The ids seen at least ``min_count`` times in (a prefix of) a run's held-out ``tokens``, less
    ``skip`` (the end-of-text id: a document boundary inside a repeat would ask the model to forget it)."""
    counts = np.bincount(np.asarray(tokens[:PROBE_TOKENS]).ravel())  # counting beats sorting here
    ids = np.flatnonzero(counts >= max(min_count, 1))
    return torch.from_numpy(ids[~np.isin(ids, list(skip))])


def induction_periods(block_size: int, n_ids: int) -> tuple[int, ...]:
    """The periods the probe repeats at: 8, 16, 32, ... up to half the context and the number of
    distinct ids, so a head that copies only at the lengths it was trained on scores lower."""
    periods, period = [], MIN_PERIOD
    while 2 * period <= block_size and period <= n_ids:
        periods.append(period)
        period *= 2
    return tuple(periods)


def repeat_probe(ids: torch.Tensor, block_size: int, *, batch: int = 8, seed: int = 0) -> list[tuple[int, torch.Tensor]]:
    """(period, (batch, 2 * period) sequences) for each of ``induction_periods``: random draws
    from ``ids`` without replacement, each written twice, the same for the same ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return [(period, repeated_random_tokens(batch, period, ids, generator))
            for period in induction_periods(block_size, len(ids))]


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
    induction = [torch.full((probs.shape[1],), 0.0 if probe else math.nan) for probs in text]
    for period, sequences in probe:
        for layer, probs in enumerate(attention_maps(model, sequences.to(text_windows.device))):
            induction[layer] += induction_score(probs, period).mean(0) / len(probe)
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


@dataclass(frozen=True)
class RepeatLoss:
    first: float  # mean loss (nats) on the first copy's tokens: unpredictable, about log(#ids)
    second: float  # on the second copy's tokens after its first: near 0 once the model copies


@torch.no_grad()
def repeat_loss(model: nn.Module, probe: list[tuple[int, torch.Tensor]], device: torch.device) -> RepeatLoss:
    """The model's loss on the first and the second copy of ``repeat_probe``'s sequences, leaving
    out each copy's first token, which nothing predicts."""
    first = second = 0.0
    with eval_mode(model):
        for period, sequences in probe:
            sequences = sequences.to(device)
            logprobs = torch.log_softmax(model(sequences[:, :-1]).float(), dim=-1)
            nll = -logprobs.gather(-1, sequences[:, 1:, None])[..., 0]  # nll[:, i]: of token i + 1
            first += float(nll[:, :period - 1].mean()) / len(probe)
            second += float(nll[:, period:].mean()) / len(probe)
    return RepeatLoss(first, second)


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


def attention_summary(model: nn.Module, text_windows: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, float]:
    """What training logs at each evaluation: each layer's mean attention entropy, the best head's
    and each layer's induction score, and ``repeat_loss``."""
    if ids is None:
        ids = probe_ids(text_windows.cpu().numpy(), min_count=1)
    roles = head_roles(model, text_windows, ids)
    summary = {}
    for layer in range(model.config.n_layer):
        heads = [r.entropy_bits for r in roles if r.layer == layer]
        summary[f"attn_entropy_layer{layer}"] = sum(heads) / len(heads)
    probe = repeat_probe(ids, model.config.block_size)
    if not probe:  # a context or a corpus too small to probe: log no induction statistics at all
        return summary
    summary["induction_best"] = max(r.induction for r in roles)
    for layer, total in enumerate(layer_induction(roles)):
        summary[f"induction_layer{layer}"] = total
    loss = repeat_loss(model, probe, text_windows.device)
    summary["repeat_loss_first"], summary["repeat_loss_second"] = loss.first, loss.second
    return summary


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
