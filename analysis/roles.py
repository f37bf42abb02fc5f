"""Scores that say what a head does, from its attention probabilities, and the repeated-sequence
probe that training records at each evaluation (``attention_summary``).

Every score takes ``probs`` of shape (..., T, T): row i is where query position i puts its weight
over key positions 0..T-1. Leading dimensions (batch, heads) are kept, so one call scores every head
at once. ``attention_maps`` reads them from a model (``GPT.attention_weights``: the forward pass's
own code)."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from model.gpt import eval_mode


@torch.no_grad()
def attention_maps(model: nn.Module, idx: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the (B, n_head, T, T) attention probabilities of ``model`` on ``idx`` (B, T),
    computed in eval mode (no dropout) and returned on the CPU in fp32."""
    with eval_mode(model):
        return [probs.float().cpu() for probs in model.attention_weights(idx)]


def previous_token_score(probs: torch.Tensor) -> torch.Tensor:
    """Mean of ``probs[..., i, i - 1]`` over queries i >= 1. A head near 1 copies the previous
    token's information forward, the first step of an induction circuit."""
    return probs.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def sink_score(probs: torch.Tensor) -> torch.Tensor:
    """Mean of ``probs[..., i, 0]`` over queries i >= 1: many heads park weight on the first token
    when nothing else is relevant, because softmax must put its mass somewhere."""
    return probs[..., 1:, 0].mean(-1)


def attention_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Mean over queries of the entropy of their weights, in bits: 0 is a head that looks at one
    token, log2(i + 1) a query i that spreads evenly."""
    p = probs.double()
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    return (-plogp.sum(-1) / math.log(2)).mean(-1).to(probs.dtype)


def induction_score(probs: torch.Tensor, period: int, offset: int = 0, length: int | None = None) -> torch.Tensor:
    """Mean weight on the token after the earlier occurrence, for a sequence whose positions
    ``offset .. offset + length - 1`` are repeated at ``offset + period ..`` (``length`` None: the
    whole period): query ``offset + period + j`` on key ``offset + j + 1``. A head near 1 completes
    patterns it has seen before in the context ("A B ... A -> B") whatever the tokens mean."""
    length = period if length is None else length
    _check_repeat(probs, period, offset, length)
    queries = torch.arange(length, device=probs.device) + offset + period
    keys = queries - period + 1
    return probs[..., queries, keys].mean(-1)


def copy_score(probs: torch.Tensor, period: int, offset: int, length: int) -> torch.Tensor:
    """Mean weight on the token about to be copied, for a span of ``length`` tokens at ``offset``
    written again at ``offset + period`` (a tool's result repeated as the answer): query
    ``offset + period + j - 1``, which predicts the repeat's j-th token, on key ``offset + j``."""
    _check_repeat(probs, period, offset, length)
    keys = torch.arange(length, device=probs.device) + offset
    return probs[..., keys + period - 1, keys].mean(-1)


def _check_repeat(probs: torch.Tensor, period: int, offset: int, length: int) -> None:
    T = probs.shape[-1]
    if not 1 <= length <= period or offset < 0 or offset + period + length > T:
        raise ValueError(f"a span of {length} at offset {offset} repeated {period} later does not fit in {T} positions")


def repeated_random_tokens(batch: int, period: int, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """(batch, 2 * period) ids: ``period`` distinct ids drawn from ``ids``, then the same again.
    Random ids carry no meaning the model could have learned, so only a head that looks back for
    an earlier copy can attend to what came next. ``ids`` should be ids the model was trained on
    (an unseen id's embedding cannot be told from its neighbours'), and distinct, so that the token
    to copy is unambiguous."""
    if period > len(ids):
        raise ValueError(f"a repeat of period {period} needs {period} distinct ids, only {len(ids)} given")
    order = torch.rand(batch, len(ids), generator=generator).argsort(dim=1)[:, :period]
    first = ids[order]
    return torch.cat([first, first], dim=1)


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


def probe_induction(model: nn.Module, probe: list[tuple[int, torch.Tensor]], device: torch.device) -> list[torch.Tensor]:
    """Per layer, each head's ``induction_score`` on ``repeat_probe``'s sequences, averaged over its periods."""
    induction = [0.0] * model.config.n_layer
    for period, sequences in probe:
        for layer, probs in enumerate(attention_maps(model, sequences.to(device))):
            induction[layer] = induction[layer] + induction_score(probs, period).mean(0) / len(probe)
    return induction


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


def attention_summary(model: nn.Module, text_windows: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, float]:
    """What training logs at each evaluation: each layer's mean attention entropy over the held-out
    ``text_windows``, the best head's and each layer's summed induction score on ``repeat_probe``'s
    sequences drawn from ``ids`` (default: every id in the windows), and ``repeat_loss``."""
    if ids is None:
        ids = probe_ids(text_windows.cpu().numpy(), min_count=1)
    summary = {}
    for layer, probs in enumerate(attention_maps(model, text_windows)):
        heads = attention_entropy(probs).mean(0).tolist()
        summary[f"attn_entropy_layer{layer}"] = sum(heads) / len(heads)
    probe = repeat_probe(ids, model.config.block_size)
    if not probe:  # a context or a corpus too small to probe: log no induction statistics at all
        return summary
    induction = [heads.tolist() for heads in probe_induction(model, probe, text_windows.device)]
    summary["induction_best"] = max(max(heads) for heads in induction)
    for layer, heads in enumerate(induction):
        summary[f"induction_layer{layer}"] = sum(heads)
    loss = repeat_loss(model, probe, text_windows.device)
    summary["repeat_loss_first"], summary["repeat_loss_second"] = loss.first, loss.second
    return summary
