"""The rolling cache (attention sinks) of rotary and no-position runs against references that never
move a cached entry, for grouped-query and latent attention; learned runs still re-encode."""

import math
from dataclasses import dataclass

import pytest
import torch

from inference.engine import Engine, Event, decode
from inference.sampling import SamplingSettings, Window
from model.config import GPTConfig
from model.gpt import GPT, rotary, rotate

BLOCK = 16
SINKS = 4
KEEP = 12  # the engine's default for a rolling window: three quarters of it
VOCAB = 61
TOLERANCE = dict(rtol=0, atol=2e-4)  # fp32 log-probabilities: a chunked prefill and single steps round apart
KINDS = {"gqa-rope": dict(positions="rope"), "gqa-none": dict(positions="none"),
         "mla-rope": dict(positions="rope", attention="mla", n_kv_head=4, kv_latent_dim=32),
         "mla-none": dict(positions="none", attention="mla", n_kv_head=4, kv_latent_dim=32)}


def tiny_model(n_layer: int, seed: int = 0, block_size: int = BLOCK, **options) -> GPT:
    """Random weights with spread logits, so a greedy token is never a near-tie."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=block_size, n_layer=n_layer, n_head=4,
                          n_kv_head=options.pop("n_kv_head", 2), n_embd=64, **options)).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 1.0 / math.sqrt(param.shape[1]))
        model.tok_emb.weight.normal_(0.0, 1.0)
    return model


@dataclass(frozen=True)
class Rule:
    """StreamingLLM's rule: keep the first ``sinks`` and the newest, cut to ``keep`` past ``block``."""

    block: int = BLOCK
    sinks: int = SINKS
    keep: int = KEEP

    def after(self, kept: list[int], index: int) -> list[int]:
        kept = [*kept, index]
        if len(kept) > self.block:
            del kept[self.sinks:self.sinks + len(kept) - self.keep]
        return kept

    def at(self, index: int) -> list[int]:
        kept: list[int] = []
        for j in range(index + 1):
            kept = self.after(kept, j)
        return kept


class ReadTimeRotation:
    """The reference for any depth: a one-row ``LayerCache`` fed a token per pass that never moves an
    entry as written; a read turns the rotary part to the token's present slot."""

    def __init__(self, model: GPT, rule: Rule = Rule()) -> None:
        self.model, self.rule = model, rule
        self.kept: list[int] = []
        self.written: dict[tuple[int, int], tuple[tuple[torch.Tensor, ...], int]] = {}
        self.rotary = model.config.positions == "rope"
        self.part = slice(None) if model.config.attention == "gqa" else slice(model.config.kv_latent_dim, None)

    def feed(self, token: int, index: int) -> torch.Tensor:
        self.kept = self.rule.after(self.kept, index)
        self.index, self.slot = index, len(self.kept) - 1
        hidden = self.model.hidden_states(torch.tensor([[token]]), torch.tensor([[self.slot]]), self)
        return torch.log_softmax(self.model.logits(hidden)[0, -1], dim=-1)

    def update(self, layer: int, *new: torch.Tensor) -> tuple[list[torch.Tensor], None]:
        self.written[layer, self.index] = (new, self.slot)
        reads = [self.at_slot(*self.written[layer, j], slot) for slot, j in enumerate(self.kept)]
        return [torch.cat(parts, dim=2) for parts in zip(*reads)], None

    def at_slot(self, entries: tuple[torch.Tensor, ...], written_at: int, slot: int) -> tuple[torch.Tensor, ...]:
        if not self.rotary or slot == written_at:
            return entries
        first = entries[0].clone()  # the key (gqa), or the latent beside its rotary key (mla)
        turn = rotary(torch.tensor([[slot - written_at]]), self.model.config.rope_dim, self.model.config.rope_theta)
        first[..., self.part] = rotate(first[..., self.part], turn)
        return (first, *entries[1:])


def engine_logprobs(model: GPT, prompts: list[list[int]], new: int, prefill_chunk: int = 8,
                    **engine) -> list[list[Event]]:
    """Each prompt's generated events (greedy, top 5 log-probabilities), side by side in one engine."""
    events: list[list[Event]] = [[] for _ in prompts]
    runner = Engine(model, max_batch=len(prompts), prefill_chunk=prefill_chunk, **engine)
    settings = SamplingSettings(max_new_tokens=new, temperature=0.0, top_p=None)
    for i, prompt in enumerate(prompts):
        runner.submit(prompt, settings, lambda event, i=i: events[i].append(event), logprobs=5)
    runner.run_until_idle()
    return [[e for e in row if e.token_id is not None] for row in events]


def prompts(lengths: tuple[int, ...] = (5, 11, 2 * BLOCK + 7)) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def assert_follows(events: list[Event], prompt: list[int], reference_logprobs) -> None:
    """The engine's tokens and top 5 log-probabilities are the reference's, fed the same stream."""
    stream = list(prompt)
    logprobs = None
    for index, token in enumerate(prompt):
        logprobs = reference_logprobs(stream, index)
    for event in events:
        assert event.token_id == int(logprobs.argmax())
        top = torch.tensor([value for _, value in event.logprob.top])
        torch.testing.assert_close(top, logprobs.topk(5).values, **TOLERANCE)
        assert [i for i, _ in event.logprob.top] == logprobs.topk(5).indices.tolist()
        stream.append(event.token_id)
        logprobs = reference_logprobs(stream, len(stream) - 1)


ENGINES = {"plain": dict(batch_invariant=False), "server": dict(batch_invariant=True),
           "uncached": dict(use_cache=False)}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("engine", list(ENGINES))
def test_one_layer_rolling_cache_equals_recomputing_the_kept_tokens(kind, engine):
    """One layer: an entry depends on its token and slot alone, so a forward pass over the kept tokens
    is the reference, for the engine with and without its cache."""
    model = tiny_model(1, **KINDS[kind])
    rows = prompts()

    def recomputed(stream: list[int], index: int) -> torch.Tensor:
        window = torch.tensor([[stream[j] for j in Rule().at(index)]])
        return torch.log_softmax(model(window)[0, -1], dim=-1)

    with torch.inference_mode():
        events = engine_logprobs(model, rows, 3 * BLOCK, **ENGINES[engine])
        for row_events, prompt in zip(events, rows):
            assert_follows(row_events, prompt, recomputed)


@pytest.mark.parametrize("kind", list(KINDS))
def test_two_layer_rolling_cache_equals_a_cache_that_turns_keys_when_read(kind):
    """Two layers: deeper entries were computed beside tokens since evicted, so the reference turns
    keys at each read where the engine moves them once per eviction."""
    model = tiny_model(2, seed=1, **KINDS[kind])
    rows = prompts()
    with torch.inference_mode():
        events = engine_logprobs(model, rows, 3 * BLOCK)
        for row_events, prompt in zip(events, rows):
            reference = ReadTimeRotation(model)
            assert_follows(row_events, prompt, lambda stream, index: reference.feed(stream[index], index))


@pytest.mark.parametrize("kind", ["gqa-rope", "mla-rope"])
def test_the_reference_catches_keys_moved_without_turning(kind):
    """A cache that moves kept entries without turning their rotary keys is caught."""
    model = tiny_model(2, seed=1, **KINDS[kind])
    model.move_entries = lambda entries, offset: None  # the bug: entries move, keys keep their angle
    prompt = prompts()[0]
    with torch.inference_mode():
        events, = engine_logprobs(model, [prompt], 2 * BLOCK)
        reference = ReadTimeRotation(model)
        with pytest.raises(AssertionError):
            assert_follows(events, prompt, lambda stream, index: reference.feed(stream[index], index))


def test_the_window_slide_rules():
    rolling = Window.for_positions("rope", BLOCK, sinks=SINKS)
    assert (rolling.keep, rolling.sinks, rolling.rolls) == (KEEP, SINKS, True)
    assert rolling.slide(0, 0, BLOCK) == (0, 0)  # a full window still fits
    assert rolling.slide(0, 0, BLOCK + 1) == (0, BLOCK + 1 - KEEP)  # evicted after the sinks
    assert rolling.tokens(list(range(20)), 0, 5) == [0, 1, 2, 3, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    learned = Window.for_positions("learned", BLOCK)
    assert (learned.keep, learned.rolls) == (BLOCK // 2, False)
    assert learned.slide(0, 0, BLOCK + 1) == (BLOCK + 1 - BLOCK // 2, 0)  # re-encode the recent half
    assert Window.for_positions("none", BLOCK, keep_fraction=1.0).keep == BLOCK  # one token at a time
    # Learned runs re-encode, and sinks that do not fit are refused.
    model = tiny_model(1, positions="learned")
    assert not Engine(model, max_batch=1).window.rolls
    with pytest.raises(ValueError, match="sinks must be 0 to 15"):
        Engine(tiny_model(1, positions="rope"), max_batch=1, sinks=BLOCK)
    with pytest.raises(AssertionError, match="cannot move"):
        model.move_entries({}, 1)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("chunk", [5, BLOCK])
def test_a_long_prompt_prefilled_in_chunks_equals_feeding_it_one_token_at_a_time(kind, chunk):
    """A prefill a token per chunk rolls as decoding does; chunks that do not divide the window, or
    fill it, must end with the same cache."""
    model = tiny_model(2, seed=2, **KINDS[kind])
    prompt = prompts()[-1]
    with torch.inference_mode():
        one_by_one, = engine_logprobs(model, [prompt], BLOCK, prefill_chunk=1)
        chunked, = engine_logprobs(model, [prompt], BLOCK, prefill_chunk=chunk)
    assert [e.token_id for e in chunked] == [e.token_id for e in one_by_one]
    for ours, reference in zip(chunked, one_by_one):
        torch.testing.assert_close(torch.tensor([v for _, v in ours.logprob.top]),
                                   torch.tensor([v for _, v in reference.logprob.top]), **TOLERANCE)


SMALL_WINDOWS = range(1, 9)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("block", SMALL_WINDOWS)
def test_every_small_window_rolls_with_sinks_that_fit_it(kind, block):
    """The default sinks fit any window (a quarter under 16 tokens), and a roll keeps three quarters
    of it, never fewer than the sinks and the newest token."""
    sinks = min(SINKS, block // 4)
    rule = Rule(block, sinks, max(int(0.75 * block), sinks + 1))
    model = tiny_model(2, seed=1, block_size=block, **KINDS[kind])
    prompt = prompts((3 * block + 1,))[0]
    with torch.inference_mode():
        events, = engine_logprobs(model, [prompt], 3 * block, prefill_chunk=3)
        reference = ReadTimeRotation(model, rule)
        assert_follows(events, prompt, lambda stream, index: reference.feed(stream[index], index))


@pytest.mark.parametrize("block", SMALL_WINDOWS)
def test_every_small_learned_window_re_encodes_as_recomputation_does(block):
    """A learned run never rolls: a long prompt is cut to its last block_size tokens, and the cache
    re-encodes the window a recomputation reads."""
    model = tiny_model(2, seed=1, block_size=block, positions="learned")
    prompt = prompts((3 * block + 1,))[0]
    settings = SamplingSettings(max_new_tokens=3 * block, temperature=0.0, top_p=None)
    with torch.inference_mode():
        cached, = decode(model, [prompt], settings)
        recomputed, = decode(model, [prompt], settings, use_cache=False)
        cut, = decode(model, [prompt[-block:]], settings)
    assert cached.prompt_tokens == block and len(cached.token_ids) == 3 * block
    assert cached.token_ids == recomputed.token_ids == cut.token_ids


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_long_prompts_log_probabilities_are_those_of_its_rolling_prefill(kind):
    """With echo, a long prompt's tokens get the log-probabilities of feeding it a token at a time."""
    model = tiny_model(2, seed=1, **KINDS[kind])
    prompt = prompts()[-1]
    finishes = []
    engine = Engine(model, max_batch=1, prefill_chunk=5)
    settings = SamplingSettings(max_new_tokens=1, temperature=0.0, top_p=None)
    with torch.inference_mode():
        engine.submit(prompt, settings, lambda e: e.finish and finishes.append(e.finish), logprobs=3, echo=True)
        engine.run_until_idle()
        reference = ReadTimeRotation(model)
        expected = [reference.feed(token, index) for index, token in enumerate(prompt[:-1])]
    first, *rest = finishes[0].prompt_logprobs
    assert first is None and len(rest) == len(prompt) - 1
    for logprob, token, logprobs in zip(rest, prompt[1:], expected):
        assert logprob.token_id == token
        torch.testing.assert_close(torch.tensor(logprob.logprob), logprobs[token], **TOLERANCE)
        assert [i for i, _ in logprob.top] == logprobs.topk(3).indices.tolist()


@pytest.mark.parametrize("prompt, new, cached", [(list(range(1, 17)), 3 * BLOCK, 8), (prompts()[-1], BLOCK, BLOCK)])
def test_a_rolled_row_stores_and_finds_only_its_first_windows_prefix_pages(prompt, new, cached):
    """Pages are chunks from position 0: a rolled row adds none past its first window, and a repeat
    of the prompt copies those in (all but a last page that ends the prompt, computed for its logits)
    and gets the same tokens."""
    model = tiny_model(2, positions="rope")
    settings = SamplingSettings(max_new_tokens=new, temperature=0.0, top_p=None)
    engine = Engine(model, max_batch=1, prefill_chunk=8, prefix_cache_bytes=2**20)
    finishes = []
    with torch.inference_mode():
        for _ in range(2):
            engine.submit(prompt, settings, lambda e: e.finish and finishes.append(e.finish))
            engine.run_until_idle()
            assert len(engine.prefix_cache) == BLOCK // 8
    assert finishes[0].token_ids == finishes[1].token_ids and len(finishes[0].token_ids) == new
    assert (finishes[0].cached_tokens, finishes[1].cached_tokens) == (0, cached)
