"""Speculative decoding in the engine: greedy output is plain decoding's token for token, a row checks
its guesses with its solo bits, and a draft run keeps in step with its row. Speculative sampling keeps
plain sampling's distribution: the first four tokens of thousands of seeded requests on a 4-token
vocabulary, against the exact distribution, by Pearson's chi-square at level ALPHA (cells under 5
pooled). A rule that accepts every guess fails it by a wide margin."""

from collections import Counter
from dataclasses import replace

import pytest
import torch

import inference.speculative
from inference.batch_invariant import row_blocked
from inference.engine import Engine, Event, Finish, decode
from inference.sampling import SamplingSettings, adjusted_logits, draw, token_distribution, uniform_per_row
from inference.settings import Speculation
from inference.speculative import Proposal, PromptLookup
from model.config import GPTConfig
from model.gpt import GPT
from run_testkit import build_model

VOCAB = 97
BLOCK = 16
K = 4
GREEDY = SamplingSettings(max_new_tokens=3 * BLOCK, temperature=0.0, top_p=None)
KINDS = {"learned": {}, "rope": dict(positions="rope"), "none": dict(positions="none"),
         "mla-rope": dict(positions="rope", attention="mla", n_kv_head=4, kv_latent_dim=32)}


def model_of(kind: str, seed: int = 0) -> GPT:
    return build_model(VOCAB, BLOCK, seed=seed, **KINDS[kind])


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (1, 3, 7, 12, BLOCK)]


class Oracle:
    """Guesses each row's plain greedy continuation, wrong at places fixed by the row's own progress (so
    accepted runs of every length); ``runs`` collects how many tokens each checked step emitted."""

    def __init__(self, answers: dict[tuple[int, ...], tuple[int, ...]]) -> None:
        self.answers = answers
        self.last: dict[int, int] = {}
        self.runs: set[int] = set()

    def propose(self, rows, limits) -> list[Proposal]:
        proposals = []
        for row, limit in zip(rows, limits):
            answer = self.answers[tuple(row.prompt_ids)]
            done = len(row.tokens) - len(row.prompt_ids)
            if id(row) in self.last:
                self.runs.add(done - self.last[id(row)])
            self.last[id(row)] = done
            guesses = []
            for i in range(limit):
                right = answer[done + i] if done + i < len(answer) else 0
                wrong = (done * 7 + i * 3 + len(row.prompt_ids)) % 5 == 0
                guesses.append((right + 1) % VOCAB if wrong else right)
            proposals.append(Proposal(guesses))
        return proposals


def speculative_engine(model: GPT, rows: int, proposer=None, *, k: int = K, **options) -> Engine:
    engine = Engine(model, max_batch=rows, speculation=Speculation("lookup", k), **options)
    if proposer is not None:
        engine.speculator.proposer = proposer
    return engine


def serve(engine: Engine, requests: list[tuple[list[int], SamplingSettings]], **submit) -> list[Finish]:
    finishes: list[Finish | None] = [None] * len(requests)

    def on(i: int):
        def event(e: Event) -> None:
            if e.finish is not None:
                finishes[i] = e.finish
        return event

    for i, (prompt, settings) in enumerate(requests):
        engine.submit(prompt, settings, on(i), **submit)
    with torch.inference_mode():
        engine.run_until_idle()
    return finishes


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("batch_invariant", [False, True], ids=["plain", "server"])
def test_greedy_speculation_is_plain_decoding_token_for_token(kind, batch_invariant):
    """Five rows side by side, three windows long each: the learned run re-encodes past its window
    and the others roll, while guesses are checked right up to the window's edge."""
    model = model_of(kind)
    rows = prompts()
    plain = decode(model, rows, GREEDY, batch_invariant=batch_invariant)
    oracle = Oracle({tuple(p): f.token_ids for p, f in zip(rows, plain)})
    engine = speculative_engine(model, len(rows), oracle, batch_invariant=batch_invariant)
    speculative = serve(engine, [(p, GREEDY) for p in rows])
    for i, (mine, theirs) in enumerate(zip(speculative, plain)):
        assert (mine.token_ids, mine.reason) == (theirs.token_ids, theirs.reason), f"row {i}"
    assert oracle.runs >= set(range(1, K + 2)), oracle.runs  # every run length, all accepted included
    assert engine.speculator.accepted > engine.speculator.steps  # more than one token a step on average


@pytest.mark.parametrize("kind", ["learned", "rope"])
def test_prompt_lookup_keeps_greedy_decoding_on_a_text_that_repeats(kind):
    model = model_of(kind, seed=2)
    phrase = list(range(10, 16))
    rows = [phrase * 2 + phrase[:2], [40, 41, 40, 41, 40], prompts()[2]]
    plain = decode(model, rows, GREEDY)
    engine = speculative_engine(model, len(rows), k=6, batch_invariant=False)
    speculative = serve(engine, [(p, GREEDY) for p in rows])
    assert [f.token_ids for f in speculative] == [f.token_ids for f in plain]
    assert engine.speculator.proposed > 0


def test_prompt_lookup_proposes_what_followed_the_latest_earlier_occurrence():
    class Row:
        row = 0

    lookup, row = PromptLookup(1), Row()
    row.tokens = [1, 2, 3, 9, 1, 2, 3, 8, 5, 1, 2, 3]
    assert lookup.propose([row], [3])[0].tokens == [8, 5, 1]  # the latest "1 2 3", not the first
    row.tokens += [7, 3]
    assert lookup.propose([row], [4])[0].tokens == []  # "7 3" is new, and one token alone does not count
    row.tokens += [9]
    assert lookup.propose([row], [2])[0].tokens == [1, 2]  # "3 9" seen once, at the start
    row = Row()  # another request in the row
    row.tokens = [4, 4, 4, 4]
    assert lookup.propose([row], [5])[0].tokens == [4, 4, 4, 4, 4]  # a loop repeats itself
    assert lookup.propose([row], [0])[0].tokens == []


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 5, 9, 13])
def test_an_accepted_run_past_the_length_limit_is_cut_where_plain_decoding_ends(max_new_tokens):
    model = model_of("rope")
    rows = prompts()
    settings = SamplingSettings(max_new_tokens=max_new_tokens, temperature=0.0, top_p=None)
    plain = decode(model, rows, settings)
    # Guesses that run on past the limit: the whole long continuation, always right.
    long = decode(model, rows, GREEDY)
    oracle = Oracle({tuple(p): f.token_ids for p, f in zip(rows, long)})
    speculative = serve(speculative_engine(model, len(rows), oracle), [(p, settings) for p in rows])
    assert [(f.token_ids, f.reason) for f in speculative] == [(f.token_ids, f.reason) for f in plain]
    assert all(len(f.token_ids) == max_new_tokens for f in speculative)


def test_end_tokens_and_stop_strings_inside_an_accepted_run_end_it_there(loaded_run):
    model, token_bytes = loaded_run.model, loaded_run.token_bytes
    prompt = [9, 10, 11]
    free = decode(model, [prompt], GREEDY, token_bytes=token_bytes)[0]
    oracle = Oracle({tuple(prompt): free.token_ids})
    end = free.token_ids[11]
    stop = free.text[20:23]
    for options in (dict(end_ids=[end]), dict(settings=replace(GREEDY, stop=(stop,)))):
        settings = options.get("settings", GREEDY)
        end_ids = options.get("end_ids", ())
        plain = decode(model, [prompt], settings, token_bytes=token_bytes, end_ids=end_ids)[0]
        engine = Engine(model, token_bytes, max_batch=1, speculation=Speculation("lookup", 8))
        engine.speculator.proposer = oracle
        mine = serve(engine, [(prompt, settings)], end_ids=end_ids)[0]
        assert plain.reason == "stop" and len(plain.token_ids) < len(free.token_ids)
        assert (mine.token_ids, mine.text, mine.reason) == (plain.token_ids, plain.text, plain.reason)


def test_logprobs_of_accepted_tokens_are_the_models_at_their_positions():
    model = model_of("learned")
    rows = prompts()
    plain_engine = Engine(model, max_batch=len(rows))
    plain = serve(plain_engine, [(p, GREEDY) for p in rows], logprobs=3)
    oracle = Oracle({tuple(p): f.token_ids for p, f in zip(rows, plain)})
    mine = serve(speculative_engine(model, len(rows), oracle), [(p, GREEDY) for p in rows], logprobs=3)
    for a, b in zip(mine, plain):
        assert a.token_ids == b.token_ids and len(a.logprobs) == len(b.logprobs) == len(a.token_ids)
        for x, y in zip(a.logprobs, b.logprobs):
            assert x.token_id == y.token_id and [i for i, _ in x.top] == [i for i, _ in y.top]
            torch.testing.assert_close(torch.tensor([x.logprob, *(v for _, v in x.top)]),
                                       torch.tensor([y.logprob, *(v for _, v in y.top)]), rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", ["learned", "rope", "mla-rope"])
def test_a_checking_pass_gives_each_row_its_solo_logits_bit_for_bit(kind):
    """What lets a server speculate: rows at different lengths, checking a token and K guesses
    in one pass, each get the bits they get alone (whole buffers under a mask, fixed row blocks)."""
    model = row_blocked(model_of(kind))
    cache = model.init_cache(8, whole_buffers=K + 1)
    rows = [p[:11] for p in prompts()[:4]] + [[3, 1]]
    check = [[5, 6, 7, 8, 9]] * len(rows)
    solo_logits = []
    with torch.inference_mode():
        for r, prompt in enumerate(rows):
            model(torch.tensor([prompt]), cache=cache, rows=[r])
            solo = model.init_cache(1, whole_buffers=K + 1)
            model(torch.tensor([prompt]), cache=solo)
            solo_logits.append(model(torch.tensor(check[:1]), cache=solo))
        together = model(torch.tensor(check), cache=cache, rows=list(range(len(rows))))
    for i, alone in enumerate(solo_logits):
        assert torch.equal(together[i:i + 1], alone), f"row {i}"


def test_rewind_forgets_the_rejected_entries():
    """A row that checked guesses and rewound is the row that never saw them: its next pass
    equals a fresh row's that was given only the accepted tokens."""
    model = model_of("rope")
    with torch.inference_mode():
        cache = model.init_cache(1)
        model(torch.tensor([[1, 2, 3, 4, 5, 6]]), cache=cache)
        cache.rewind(0, 4)
        rewound = model(torch.tensor([[7, 8]]), cache=cache)
        fresh = model.init_cache(1)
        model(torch.tensor([[1, 2, 3, 4]]), cache=fresh)
        assert torch.equal(rewound, model(torch.tensor([[7, 8]]), cache=fresh))
    with pytest.raises(AssertionError, match="holds 6 positions"):
        cache.rewind(0, 7)


@pytest.mark.parametrize("kind", ["learned", "none"])
def test_a_draft_run_keeps_greedy_decoding_and_stays_in_step_with_its_row(kind):
    """The run as its own draft guesses every token right while it sees what the row sees (any drift
    would show as rejections); a different draft still changes no token."""
    model = model_of(kind)
    longest = prompts()[-2]
    one_window = SamplingSettings(max_new_tokens=BLOCK - len(longest), temperature=0.0, top_p=None)
    for draft, rows, settings in ((model_of(kind, seed=3), prompts(), GREEDY), (model, prompts()[:-1], one_window)):
        plain = decode(model, rows, settings)
        engine = Engine(model, max_batch=len(rows), speculation=Speculation("draft", K, draft))
        mine = serve(engine, [(p, settings) for p in rows])
        assert [f.token_ids for f in mine] == [f.token_ids for f in plain]
    if kind == "learned":  # the draft is the run, and the rows ran inside one window
        assert engine.speculator.accepted == engine.speculator.proposed > 0


def test_a_draft_the_same_as_the_run_accepts_nearly_every_sampled_guess():
    """Sampling with q equal to p accepts with probability min(1, p/q) = 1: nearly every guess
    goes through (rounding apart), which a draft out of step with its row would not manage."""
    model = model_of("learned")
    settings = SamplingSettings(max_new_tokens=BLOCK - 4, temperature=1.0, top_p=None, seed=3)
    engine = Engine(model, max_batch=4, speculation=Speculation("draft", K, model))
    serve(engine, [([1, 2, 3], settings)] * 4)
    assert engine.speculator.accepted >= 0.95 * engine.speculator.proposed > 0


@pytest.mark.parametrize("extra", [["--chat"], []], ids=["chat", "text"])
def test_generate_py_speculates_with_lookup_or_a_draft_and_prints_plain_greedy_text(cli, run_dir, extra):
    flags = ["--run", run_dir, "--prompt", "ROMEO: But soft, ROMEO: But", "--temperature", 0, "--max-new-tokens", 60,
             *extra]
    code, plain, _ = cli(*flags)
    assert code == 0
    for speculate in (["--speculate", "lookup", "--speculate-k", 5], ["--speculate", "draft", "--draft-run", run_dir]):
        code, out, err = cli(*flags, *speculate)
        assert (code, out) == (0, plain)
        if not extra:
            assert f"speculative ({speculate[1]}, up to {5 if speculate[1] == 'lookup' else 4} guesses a step)" in err


# The sampling rule's distribution

TINY_VOCAB = 4
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
    model = GPT(GPTConfig(vocab_size=TINY_VOCAB, block_size=32, n_layer=1, n_head=2, n_kv_head=1, n_embd=32)).eval()
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
                for token in range(TINY_VOCAB):
                    nxt[(*prefix, token)] = probs[prefix] * float(p[token])
            probs = nxt
    return probs


def sampled_counts(model: GPT, settings: SamplingSettings, speculation: Speculation | None = None) -> Counter:
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
    assert speculation is None or speculated.accepted > 0.05 * speculated.steps, "too few accepted guesses to test"
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
    counts = sampled_counts(model, settings, speculation(proposer))
    assert (chi_square_p_value(counts, plain_distribution(model, settings)) > ALPHA) == (rule == "ours")


def test_the_exact_distribution_sums_to_one_and_matches_plain_sampling():
    """The reference itself, against the engine's plain sampler on the same seeds."""
    model, settings = tiny_model(TARGET_SEED), SETTINGS["every filter"]
    probs = plain_distribution(model, settings)
    assert abs(sum(probs.values()) - 1.0) < 1e-6 and len(probs) == TINY_VOCAB ** NEW
    assert all(p == 0 for cell, p in probs.items() if 2 in cell)  # the suppressed id
    assert chi_square_p_value(sampled_counts(model, settings), probs) > ALPHA
