"""Head-role scores (``analysis.roles``) on hand-built attention patterns whose answers are known, and the
induction probe on hand-built models whose answers are known (an induction head that tells apart only the
ids it was trained on, a uniform and a previous-token head), with the copy losses of a copier."""

import math

import numpy as np
import pytest
import torch
from torch import nn

# Through the module, so that the first probe test runs (and fails) against the metric as it was before
# the probe drew trained ids: docs/attention.md#the-induction-score-and-what-it-can-see.
from analysis import maps
from analysis.roles import (MIN_COUNT, attention_entropy, attention_summary, copy_score, induction_periods,
    induction_score, previous_token_score, probe_ids, repeat_loss, repeat_probe, repeated_random_tokens, sink_score)

T = 8


# Hand-built patterns: each a (T, T) matrix whose row i is query i's weights over keys 0..T-1.


def previous_token_head(T: int) -> torch.Tensor:
    """Query 0 reads itself; every later query reads only the token before it."""
    p = torch.zeros(T, T)
    p[0, 0] = 1.0
    p[torch.arange(1, T), torch.arange(T - 1)] = 1.0
    return p


def sink_head(T: int) -> torch.Tensor:
    p = torch.zeros(T, T)
    p[:, 0] = 1.0
    return p


def uniform_head(T: int) -> torch.Tensor:
    """Each query spreads evenly over every position it may see."""
    allowed = torch.tril(torch.ones(T, T))
    return allowed / allowed.sum(-1, keepdim=True)


def test_previous_token_sink_and_entropy_scores_of_hand_built_heads():
    assert sink_score(sink_head(T)).item() == 1.0
    assert sink_score(previous_token_head(T)).item() == pytest.approx(1 / (T - 1))
    expected = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    assert sink_score(uniform_head(T)).item() == pytest.approx(expected, rel=1e-6)
    # Entropy: zero for a one-hot head, the log of the span for a uniform one.
    assert attention_entropy(previous_token_head(T)).item() == 0.0
    expected = sum(math.log2(i + 1) for i in range(T)) / T
    assert attention_entropy(uniform_head(T)).item() == pytest.approx(expected, rel=1e-6)
    # The scores keep leading dimensions.
    stacked = torch.stack([previous_token_head(T), sink_head(T), uniform_head(T)]).unsqueeze(0)
    assert previous_token_score(stacked).shape == (1, 3)
    assert torch.equal(sink_score(stacked)[0, 1], torch.tensor(1.0))
    assert previous_token_score(previous_token_head(T)).item() == 1.0
    assert previous_token_score(sink_head(T)).item() == pytest.approx(1 / (T - 1))  # only query 1's key 0
    # Repeated random tokens repeat distinct ids from the pool.
    g = torch.Generator().manual_seed(0)
    pool = torch.tensor([3, 9, 11, 40, 41, 42, 57, 60])
    ids = repeated_random_tokens(200, 7, pool, g)
    assert ids.shape == (200, 14)
    assert torch.equal(ids[:, :7], ids[:, 7:])
    assert all(len(set(row[:7].tolist())) == 7 for row in ids)  # no id twice within a sequence
    assert set(ids.unique().tolist()) == set(pool.tolist())  # every id of the pool is drawn, no other


def induction_head(period: int, offset: int) -> torch.Tensor:
    """A perfect induction head over a repeat of ``period`` tokens after ``offset`` others."""
    n = offset + 2 * period
    p = sink_head(n).clone()
    for j in range(period):
        q = offset + period + j
        p[q] = 0.0
        p[q, offset + j + 1] = 1.0
    return p


@pytest.mark.parametrize("offset", [0, 1, 3])
def test_induction_head_scores_one_and_previous_token_head_does_not(offset):
    period = 5
    assert induction_score(induction_head(period, offset), period, offset).item() == 1.0
    n = offset + 2 * period
    assert induction_score(previous_token_head(n), period, offset).item() == 0.0
    # A head that reads the earlier copy of the *same* token (not the one after it) scores 0 too.
    same = sink_head(n).clone()
    for j in range(period):
        same[offset + period + j] = 0.0
        same[offset + period + j, offset + j] = 1.0
    assert induction_score(same, period, offset).item() == 0.0


def copy_head(offset: int, period: int, length: int) -> torch.Tensor:
    """A head that reads each token of a span's first copy from the position that predicts its repeat."""
    n = offset + period + length
    p = sink_head(n).clone()
    for j in range(length):
        p[offset + period + j - 1] = 0.0
        p[offset + period + j - 1, offset + j] = 1.0
    return p


@pytest.mark.parametrize("offset, period, length", [(0, 5, 5), (2, 9, 4), (4, 6, 1)])
def test_copy_score_finds_the_head_that_reads_the_token_about_to_be_repeated(offset, period, length):
    n = offset + period + length
    assert copy_score(copy_head(offset, period, length), period, offset, length).item() == 1.0
    # The induction pairs are the copy's one token later: a copying head is an induction head there too,
    # but for the repeat's first token, which no earlier token of the span announces.
    if length > 1:
        induction = induction_score(copy_head(offset, period, length), period, offset, length).item()
        assert induction == pytest.approx((length - 1) / length)
    assert copy_score(previous_token_head(n), period, offset, length).item() == (1.0 if period == 1 else 0.0)
    # A head one token off (it reads the token before the one to copy) scores 0.
    early = torch.roll(copy_head(offset, period, length), shifts=-1, dims=-1) * torch.tril(torch.ones(n, n))
    assert copy_score(early, period, offset, length).item() == 0.0


@pytest.mark.parametrize("refused, message", [
    (lambda: induction_score(uniform_head(8), period=5), "does not fit"),
    (lambda: copy_score(uniform_head(8), period=5, offset=1, length=3), "does not fit"),
    (lambda: copy_score(uniform_head(20), period=3, offset=0, length=4), "does not fit"),  # the copies would overlap
    (lambda: repeated_random_tokens(1, 9, torch.arange(8), torch.Generator()), "needs 9 distinct ids"),
])
def test_a_repeat_that_does_not_fit_is_refused(refused, message):
    with pytest.raises(ValueError, match=message):
        refused()


# The induction probe

VOCAB = 1024
TRAINED = torch.arange(5, 5 + 96)  # 96 of 1024 ids seen in training; the rest never were
BLOCK = 128


class Config:
    block_size = BLOCK
    vocab_size = VOCAB
    n_layer = 2


def embeddings() -> torch.Tensor:
    """Unit vectors, distinct for trained ids and one shared vector for every untrained id."""
    table = torch.nn.functional.normalize(torch.randn(VOCAB, 256, generator=torch.Generator().manual_seed(0)), dim=-1)
    untrained = torch.ones(VOCAB, dtype=torch.bool)
    untrained[TRAINED] = False
    table[untrained] = table[0].clone()
    return table


class HandBuilt(nn.Module):
    """Layer 0: a previous-token head and a uniform head. Layer 1: an induction head (query i matches key j
    by the embedding of the token before j) and a uniform head."""

    config = Config()

    def __init__(self, sharpness: float = 50.0):
        super().__init__()
        self.register_buffer("table", embeddings())
        self.sharpness = sharpness

    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        B, T = idx.shape
        e = self.table[idx]  # (B, T, d)
        before = torch.cat([e[:, :1], e[:, :-1]], dim=1)  # key j carries the token at j - 1
        scores = self.sharpness * e @ before.transpose(1, 2)
        scores[:, :, 0] = 0.0  # key 0 has no token before it: a neutral score
        scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        induction = torch.softmax(scores, dim=-1)
        fixed = [h.expand(B, T, T) for h in (previous_token_head(T), uniform_head(T))]
        return [torch.stack(fixed, dim=1), torch.stack([induction, fixed[1]], dim=1)]


def text_windows(count: int = 4) -> torch.Tensor:
    """Held-out windows made only of trained ids (every one of them appears)."""
    g = torch.Generator().manual_seed(1)
    return TRAINED[torch.randint(0, len(TRAINED), (count, BLOCK), generator=g)]


def test_each_hand_built_head_scores_what_it_should_on_trained_ids():
    # head_roles draws from the ids of the held-out windows: every one of them trained. Drawn from
    # the whole vocabulary (most ids untrained and alike), this head would read about 1 / period.
    roles = {(r.layer, r.head): r for r in maps.head_roles(HandBuilt(), text_windows())}
    assert roles[1, 0].induction > 0.95
    assert roles[1, 0].induction == pytest.approx(1.0, abs=0.05)
    assert maps.layer_induction(list(roles.values()))[1] > 0.95
    # The same head is blind when the ids it cannot tell apart are drawn: the probe, not the head, fails.
    assert maps.head_roles(HandBuilt(), text_windows(), torch.arange(200, VOCAB))[2].induction < 0.1
    # A uniform head scores its share of each query, and a previous-token head zero.
    roles = {(r.layer, r.head): r for r in maps.head_roles(HandBuilt(), text_windows(), TRAINED)}
    periods = induction_periods(BLOCK, len(TRAINED))
    # Query p + j of a uniform head puts 1 / (p + j + 1) on each key it may see.
    expected = np.mean([np.mean([1 / (p + j + 1) for j in range(p)]) for p in periods])
    assert roles[0, 1].induction == pytest.approx(expected, rel=1e-5)
    assert roles[1, 1].induction == pytest.approx(expected, rel=1e-5)
    assert roles[0, 0].induction == 0.0
    assert roles[0, 0].previous_token == 1.0
    assert maps.layer_induction(list(roles.values()))[0] == pytest.approx(expected, rel=1e-5)
    # What a run logs at each evaluation: the best head, each layer's sum and the copy losses.
    summary = attention_summary(HandBuiltCopier(), text_windows(), TRAINED)
    assert summary["induction_best"] == pytest.approx(1.0, abs=0.05)
    assert summary["induction_layer0"] == pytest.approx(expected, rel=1e-5)
    assert summary["induction_layer1"] == pytest.approx(1 + expected, abs=0.05)
    assert summary["repeat_loss_first"] == pytest.approx(math.log(VOCAB), rel=1e-5)
    assert summary["repeat_loss_second"] < 1e-3


def test_periods_and_without_one_induction_is_not_measured_nor_logged():
    few = TRAINED[:7]
    assert all(math.isnan(r.induction) for r in maps.head_roles(HandBuilt(), text_windows(), few))
    summary = attention_summary(HandBuilt(), text_windows(), few)
    assert sorted(summary) == ["attn_entropy_layer0", "attn_entropy_layer1"]
    # Periods double up to half the context and the ids available.
    assert induction_periods(128, 1000) == (8, 16, 32, 64)
    assert induction_periods(128, 20) == (8, 16)
    assert induction_periods(40, 1000) == (8, 16)
    assert induction_periods(128, 7) == () and induction_periods(15, 1000) == ()


def test_probe_ids_and_the_repeat_loss_of_a_copier():
    tokens = np.array([0, 7, 3, 7, 0, 9, 3], dtype=np.uint16)
    assert probe_ids(tokens, skip=[0], min_count=1).tolist() == [3, 7, 9]
    assert probe_ids(tokens, skip=[0], min_count=2).tolist() == [3, 7]  # 9 was seen once
    common = np.repeat(np.array([4, 5, 6], dtype=np.uint32), [MIN_COUNT, MIN_COUNT - 1, 50])
    assert probe_ids(common).tolist() == [4, 6]
    probe = repeat_probe(torch.arange(10, 30), 64, batch=3, seed=5)
    assert [period for period, _ in probe] == [8, 16]
    again = repeat_probe(torch.arange(10, 30), 64, batch=3, seed=5)
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(probe, again))
    # The repeat loss is uniform on the first copy and near zero on the second.
    loss = repeat_loss(Copier(), repeat_probe(TRAINED, BLOCK, batch=2), torch.device("cpu"))
    assert loss.first == pytest.approx(math.log(VOCAB), rel=1e-5)
    # The copied token holds e^20 of the mass against 1 for each of the other 1023 ids.
    assert loss.second == pytest.approx(math.log1p((VOCAB - 1) * math.exp(-20.0)), abs=1e-6)  # fp32 log-softmax


class Copier(nn.Module):
    """Logits that predict, after a token seen before, the token that followed it (log-odds 20), and
    are uniform over the vocabulary otherwise."""

    config = Config()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        logits = torch.zeros(B, T, VOCAB)
        for b in range(B):
            seen: dict[int, int] = {}
            for i in range(T):
                token = int(idx[b, i])
                if token in seen and seen[token] + 1 < T:
                    logits[b, i, int(idx[b, seen[token] + 1])] = 20.0
                seen[token] = i
        return logits


class HandBuiltCopier(HandBuilt):
    forward = Copier.forward
