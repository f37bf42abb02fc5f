"""Sampling helpers: top-k, top-p, repetition penalty, temperature, generator semantics."""

import pytest
import torch

import inference.sampling as sampling
from inference.sampling import apply_repetition_penalty, filter_logits, sample_next_token

NEG_INF = float("-inf")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.randn(4, 50, generator=gen(0))
    for k in (1, 7, 50, 80):
        kept = filter_logits(logits, top_k=k).isfinite()
        assert kept.sum(-1).tolist() == [min(k, 50)] * 4
        smallest_kept = logits.masked_fill(~kept, float("inf")).min(-1).values
        largest_dropped = logits.masked_fill(kept, NEG_INF).max(-1).values
        assert (smallest_kept > largest_dropped).all()
        out = filter_logits(logits, top_k=k)
        assert torch.equal(out[out.isfinite()], logits[out.isfinite()])  # kept values unchanged
    assert filter_logits(torch.tensor([[1.0, 3.0, 3.0, 3.0, 0.0]]), top_k=2).isfinite().sum().item() == 2  # ties


@pytest.mark.parametrize("p, kept", [(0.3, [0]), (0.5, [0]), (0.75, [0, 1]), (0.8, [0, 1]), (0.81, [0, 1, 2]),
                                     (0.99, [0, 1, 2, 3])])
def test_top_p_keeps_smallest_prefix_with_enough_mass(p, kept):
    # Probabilities 0.5, 0.3, 0.15, 0.05 sit on shuffled ids.
    order = torch.tensor([2, 0, 3, 1])
    logits = torch.empty(1, 4)
    logits[0, order] = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    out = filter_logits(logits, top_p=p)
    assert sorted(out[0].isfinite().nonzero().flatten().tolist()) == sorted(order[kept].tolist())
    # Four equal probabilities of exactly 0.25: two ids hold exactly 0.5, so a third is not needed.
    assert filter_logits(torch.zeros(1, 4), top_p=0.5).isfinite().sum().item() == 2


def test_top_p_property_on_random_distributions():
    logits = 2 * torch.randn(64, 30, generator=gen(2))
    probs = logits.softmax(-1)
    for p in (0.1, 0.5, 0.9):
        kept = filter_logits(logits, top_p=p).isfinite()
        for row in range(64):
            mass = probs[row][kept[row]]
            dropped = probs[row][~kept[row]]
            assert mass.sum() >= p - 1e-6  # enough mass
            assert mass.sum() - mass.min() < p + 1e-6  # minimal: without its smallest it falls short
            if dropped.numel():  # a prefix by probability
                assert mass.min() >= dropped.max()
    assert torch.equal(filter_logits(logits, top_p=1.0), logits)
    assert torch.equal(filter_logits(logits), logits)


def test_temperature_zero_is_argmax_and_the_repetition_penalty():
    logits = torch.randn(5, 40, generator=gen(4))
    g = gen(5)
    before = g.get_state()
    assert torch.equal(sample_next_token(logits, temperature=0.0, top_k=3, generator=g), logits.argmax(-1))
    assert torch.equal(g.get_state(), before)
    # Greedy applies the repetition penalty first: 3 / 2 = 1.5 < 2.
    penalised = sample_next_token(torch.tensor([[3.0, 2.0, -1.0]]), repetition_penalty=2.0,
                                  prev_tokens=torch.tensor([[0]]))
    assert penalised.item() == 1
    # The repetition penalty divides positive logits and multiplies negative ones.
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5]])
    seen = torch.tensor([[0, 1, 1, 4]])  # id 1 twice: penalised once
    out = apply_repetition_penalty(logits, seen, 2.0)
    assert torch.equal(out, torch.tensor([[1.0, -4.0, 1.0, -1.0, 0.25]]))
    assert torch.equal(logits, torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5]]))  # input untouched
    assert apply_repetition_penalty(logits, seen, 1.0) is logits
    per_row = apply_repetition_penalty(torch.ones(2, 4), torch.tensor([[0], [3]]), 4.0)
    assert per_row.tolist() == [[0.25, 1, 1, 1], [1, 1, 1, 0.25]]


def test_sampling_is_inverse_cdf_of_one_uniform_per_row_and_never_past_the_mass(monkeypatch):
    probs = torch.tensor([0.1, 0.2, 0.7])
    logits = probs.log().expand(4, 3)
    for seed in range(30):
        u = torch.rand(4, generator=gen(seed))
        expected = (u >= 0.1).long() + (u >= 0.3).long()  # id order: [0, .1), [.1, .3), [.3, 1)
        g = gen(seed)
        assert torch.equal(sample_next_token(logits, temperature=1.0, generator=g), expected)
        u_gen = gen(seed)
        torch.rand(4, generator=u_gen)  # one draw per row, whatever the logits
        assert torch.equal(g.get_state(), u_gen.get_state())
    # Frequencies follow the distribution.
    probs = torch.tensor([0.6, 0.3, 0.1])
    tokens = sample_next_token(probs.log().expand(20000, 3), temperature=1.0, generator=gen(14))
    freq = torch.bincount(tokens, minlength=3).float() / 20000
    assert (freq - probs).abs().max() < 0.015  # ~4 standard errors
    # A list of generators gives each row its own stream.
    logits = torch.randn(3, 25, generator=gen(8))
    batch = sample_next_token(logits, temperature=1.0, generator=[gen(10), gen(11), gen(12)])
    for row in range(3):
        single = sample_next_token(logits[row:row + 1], temperature=1.0, generator=gen(10 + row))
        assert batch[row] == single[0]
    with pytest.raises(ValueError, match="got 2 generators for 3 rows"):
        sample_next_token(logits, temperature=1.0, generator=[gen(1), gen(2)])
    # One generator serves the rows in order.
    batch, g = sample_next_token(logits, temperature=1.0, generator=gen(13)), gen(13)
    assert batch.tolist() == [sample_next_token(logits[row:row + 1], temperature=1.0, generator=g).item()
                              for row in range(3)]
    # u * total can round up to total; searchsorted then points past the end (or at a filtered id).
    monkeypatch.setattr(sampling, "uniform_per_row", lambda batch, generator, device: torch.ones(batch))
    logits = torch.tensor([[0.0, 0.0, 0.0, 5.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0]])
    assert sample_next_token(logits, temperature=1.0, top_k=2).item() == 5


def nucleus_by_full_sort(probs: torch.Tensor, p: float) -> torch.Tensor:
    """The definition, written the slow way: sort the whole vocabulary (ties in id order)."""
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = torch.nn.functional.pad(sorted_probs.cumsum(dim=-1)[..., :-1], (1, 0))
    drop = mass_before >= p
    drop[..., 0] = False
    return torch.empty_like(drop).scatter_(-1, order, drop)


@pytest.mark.parametrize("candidates", [4, 16, 256])
def test_the_nucleus_from_candidates_equals_sorting_the_whole_vocabulary(monkeypatch, candidates):
    monkeypatch.setattr(sampling, "NUCLEUS_CANDIDATES", candidates)
    g = gen(4)
    flat = (0.3 * torch.randn(16, 300, generator=g)).softmax(-1)  # wide nuclei: the fallback runs
    peaked = (4 * torch.randn(16, 300, generator=g)).softmax(-1)  # narrow nuclei: candidates suffice
    # Probabilities on a coarse grid tie often, at the nucleus edge and at the last candidate.
    tied = torch.randint(1, 6, (16, 300), generator=g).float()
    tied = tied / tied.sum(-1, keepdim=True)
    for probs in (flat, peaked, tied, torch.full((2, 300), 1 / 300)):
        for p in (0.05, 0.3, 0.5, 0.9, 0.999):
            assert torch.equal(sampling.outside_nucleus(probs, p), nucleus_by_full_sort(probs, p)), (candidates, p)


def test_suppressed_and_filtered_ids_are_never_picked_greedy_or_sampled():
    logits = torch.tensor([[5.0, 4.0, -1.0, 0.0]]).expand(500, 4)
    assert sample_next_token(logits[:1], suppress_ids=(0,)).item() == 1
    tokens = sample_next_token(logits, temperature=2.0, suppress_ids=(0, 1), generator=gen(15))
    assert set(tokens.tolist()) == {2, 3}
    assert logits[0, 0] == 5.0  # the caller's logits are left as they were
    filtered = torch.randn(1, 30, generator=gen(6)).expand(500, 30)  # nor are the ids top-k leaves out
    tokens = sample_next_token(filtered, temperature=1.5, top_k=3, generator=gen(7))
    assert set(tokens.tolist()) == set(filtered[0].topk(3).indices.tolist())
