"""Head-role scores on hand-built attention patterns whose answers are known."""

import math

import pytest
import torch
from heads_testkit import previous_token_head, sink_head, uniform_head

from analysis.roles import (attention_entropy, copy_score, induction_score, previous_token_score,
    repeated_random_tokens, sink_score)

T = 8


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
