"""Speculative sampling keeps plain sampling's distribution: the first four tokens of thousands of
seeded requests on a 4-token vocabulary, against the exact distribution, by Pearson's chi-square at
level ALPHA (cells under 5 pooled). A rule that accepts every guess fails it by a wide margin."""

from collections import Counter
from dataclasses import replace

import pytest
import torch

import inference.speculative
from inference.engine import Engine, Event
from inference.sampling import SamplingSettings, adjusted_logits, draw, token_distribution, uniform_per_row
from inference.settings import Speculation
from model.config import GPTConfig
from model.gpt import GPT

VOCAB = 4
NEW = 4  # tokens per request: the first one sampled plainly, then up to NEW - 2 guesses a step
SAMPLES = 2000
ALPHA = 1e-4
# Every pair of the ids 0 to 2 once (a de Bruijn sequence), so prompt lookup finds a guess after
# most tokens; id 3 is left out, so the repetition penalty depends on the tokens sampled.
PROMPT = [0, 0, 1, 0, 2, 1, 1, 2, 2, 0]
SETTINGS = {
    "temperature 1": SamplingSettings(max_new_tokens=NEW, temperature=1.0, top_p=None),
    "every filter": SamplingSettings(max_new_tokens=NEW, temperature=0.7, top_k=3, top_p=0.9,
                                     repetition_penalty=2.0, suppress_ids=(2,)),
}


TARGET_SEED, DRAFT_SEED = 2, 11  # models whose guesses are accepted a third to a half of the time


def tiny_model(seed: int) -> GPT:
    """Random weights scaled up until the next-token distributions are far from flat."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=32, n_layer=1, n_head=2, n_kv_head=1, n_embd=32)).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.mul_(6.0)
    return model


def plain_distribution(model: GPT, settings: SamplingSettings) -> dict[tuple[int, ...], float]:
    """P(first NEW tokens) under plain sampling: the product, token by token, of the distribution
    ``sample_next_token`` draws from after each prefix (the repetition penalty reads the prefix)."""
    probs = {(): 1.0}
    with torch.no_grad():
        for _ in range(NEW):
            prefixes = list(probs)
            ids = torch.tensor([PROMPT + list(prefix) for prefix in prefixes])
            logits = model(ids)[:, -1]
            nxt = {}
            for prefix, row, history in zip(prefixes, logits, ids):
                adjusted = adjusted_logits(row[None], repetition_penalty=settings.repetition_penalty,
                                           prev_tokens=history[None], suppress_ids=settings.suppress_ids)
                p = token_distribution(adjusted, temperature=settings.temperature, top_k=settings.top_k,
                                       top_p=settings.top_p)[0].double()
                for token in range(VOCAB):
                    nxt[(*prefix, token)] = probs[prefix] * float(p[token])
            probs = nxt
    return probs


def speculative_counts(model: GPT, settings: SamplingSettings, speculation: Speculation) -> Counter:
    engine = Engine(model, max_batch=500, max_queue=SAMPLES, batch_invariant=False, speculation=speculation)
    counts: Counter = Counter()

    def count(event: Event) -> None:
        if event.finish is not None:
            counts[event.finish.token_ids] += 1

    with torch.inference_mode():
        for seed in range(SAMPLES):
            engine.submit(PROMPT, replace(settings, seed=seed), count)
        engine.run_until_idle()
    speculated = engine.speculator
    assert speculated.accepted > 0.05 * speculated.steps, "too few accepted guesses to test the rule"
    return counts


def chi_square_p_value(counts: Counter, probs: dict[tuple[int, ...], float]) -> float:
    """Pearson's test of ``counts`` against ``probs``; cells expected under 5 times are pooled."""
    total = sum(counts.values())
    assert set(counts) <= {cell for cell, p in probs.items() if p > 0}, "a sequence plain sampling never draws"
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for cell, p in probs.items():
        if total * p >= 5:
            observed.append(counts[cell])
            expected.append(total * p)
        else:
            pooled_o += counts[cell]
            pooled_e += total * p
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    o, e = torch.tensor(observed, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    statistic = ((o - e) ** 2 / e).sum()
    dof = torch.tensor(len(observed) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, statistic / 2))


def speculation(proposer: str) -> Speculation:
    return Speculation("lookup", 3) if proposer == "lookup" else Speculation("draft", 3, tiny_model(DRAFT_SEED))


def accept_every_guess(logits, proposal, settings, history, generator) -> list[int]:
    """The wrong rule: every guess goes through, and one token is drawn after the last."""
    adjusted = adjusted_logits(logits[-1:], suppress_ids=settings.suppress_ids)
    p = token_distribution(adjusted, temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
    return [*proposal.tokens, int(draw(p, uniform_per_row(1, generator, p.device))[0])]


# Each proposer once by default, the draft model (whose own distribution enters the acceptance
# rule) with every filter; the other two pairs with the slow tests. The wrong rule fails the test.
@pytest.mark.parametrize("proposer, name, rule", [
    ("lookup", "temperature 1", "ours"), pytest.param("lookup", "every filter", "ours", marks=pytest.mark.e2e),
    pytest.param("draft", "temperature 1", "ours", marks=pytest.mark.e2e), ("draft", "every filter", "ours"),
    ("lookup", "temperature 1", "accept every guess"), ("draft", "temperature 1", "accept every guess")])
def test_speculative_sampling_draws_from_plain_samplings_distribution(proposer, name, rule, monkeypatch):
    if rule == "accept every guess":
        monkeypatch.setattr(inference.speculative, "accepted_tokens", accept_every_guess)
    model, settings = tiny_model(TARGET_SEED), SETTINGS[name]
    counts = speculative_counts(model, settings, speculation(proposer))
    assert (chi_square_p_value(counts, plain_distribution(model, settings)) > ALPHA) == (rule == "ours")


def test_the_exact_distribution_sums_to_one_and_matches_plain_sampling():
    """The reference itself, against the engine's plain sampler on the same seeds."""
    model, settings = tiny_model(TARGET_SEED), SETTINGS["every filter"]
    probs = plain_distribution(model, settings)
    assert abs(sum(probs.values()) - 1.0) < 1e-6 and len(probs) == VOCAB ** NEW
    assert all(p == 0 for cell, p in probs.items() if 2 in cell)  # the suppressed id
    engine = Engine(model, max_batch=500, max_queue=SAMPLES, batch_invariant=False)
    counts: Counter = Counter()
    with torch.inference_mode():
        for seed in range(SAMPLES):
            engine.submit(PROMPT, replace(settings, seed=seed),
                          lambda e: e.finish and counts.update([e.finish.token_ids]))
        engine.run_until_idle()
    assert chi_square_p_value(counts, probs) > ALPHA
