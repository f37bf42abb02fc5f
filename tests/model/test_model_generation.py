"""generate_tokens / generate: cached == uncached token for token, greedy and sampled,
within and past block_size, batched and single."""

from __future__ import annotations

import pytest
import torch

from model.generation import generate, generate_tokens
from run_testkit import ALL_OPTIONS

SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.3)


def prompt(batch: int, length: int, seed: int = 0, vocab: int = 97) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_greedy_equals_a_plain_argmax_loop(make_model):
    """Independent of generate_tokens: recompute the whole sequence and take the argmax."""
    model = make_model(seed=1, block_size=80)
    seq = prompt(2, 6)
    out = generate(model, seq, 70)
    with torch.inference_mode():
        for _ in range(70):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("overrides", [dict(n_kv_head=1), dict(n_kv_head=2), dict(n_kv_head=6),
                                       dict(n_kv_head=2, **ALL_OPTIONS)], ids=["kv1", "kv2", "kv6", "options"])
def test_greedy_cached_equals_uncached(make_model, overrides):
    model = make_model(seed=2, block_size=80, **overrides)
    idx = prompt(1, 7, seed=3)
    cached = generate(model, idx, 64, use_cache=True)
    assert torch.equal(cached, generate(model, idx, 64, use_cache=False))
    assert torch.equal(cached[:, :7], idx)
    assert len(set(cached[0, 7:].tolist())) > 5  # a real continuation, not one repeated id


def test_seeded_sampling_cached_equals_uncached(make_model):
    model = make_model(seed=4, block_size=80)
    idx = prompt(1, 5, seed=5)
    cached = generate(model, idx, 64, **SAMPLING, use_cache=True, generator=gen(11))
    uncached = generate(model, idx, 64, **SAMPLING, use_cache=False, generator=gen(11))
    assert torch.equal(cached, uncached)
    other_seed = generate(model, idx, 64, **SAMPLING, use_cache=True, generator=gen(12))
    assert not torch.equal(cached, other_seed)


@pytest.mark.parametrize("keep_fraction", [0.5, 0.25, 1.0])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_past_block_size_cached_equals_uncached(make_model, keep_fraction, sampled):
    model = make_model(seed=6, block_size=16, n_kv_head=3)
    idx = prompt(2, 5, seed=7)
    kwargs = dict(SAMPLING) if sampled else {}
    runs = [
        generate(model, idx, 48, **kwargs, use_cache=use_cache, keep_fraction=keep_fraction,
                       generator=[gen(21), gen(22)])
        for use_cache in (True, False)
    ]
    assert runs[0].shape == (2, 5 + 48)
    assert torch.equal(runs[0], runs[1])


def test_window_slide_and_penalty_follow_the_documented_rules(make_model):
    """After the window fills, the model sees only the most recent keep_fraction*block_size
    tokens; the repetition penalty still covers every token of the row so far."""
    model = make_model(seed=8, block_size=16)
    idx = prompt(1, 10, seed=9)
    out = generate(model, idx, 30, keep_fraction=0.5, repetition_penalty=1.5)
    tokens = out[0].tolist()
    start = 0
    with torch.inference_mode():
        for n in range(10, 40):  # predict tokens[n] from the window the rule prescribes
            if n - start > 16:
                start = n - 8
            logits = model(torch.tensor([tokens[start:n]]))[0, -1]
            for seen in set(tokens[:n]):
                logits[seen] = logits[seen] / 1.5 if logits[seen] > 0 else logits[seen] * 1.5
            assert logits.argmax().item() == tokens[n], f"token {n}"


def test_prompt_longer_than_block_size_is_cut_to_its_tail(make_model):
    model = make_model(seed=10, block_size=16)
    idx = prompt(1, 40, seed=11)
    out = generate(model, idx, 20)
    assert torch.equal(out, generate(model, idx, 20, use_cache=False))
    assert torch.equal(out[:, 40:], generate(model, idx[:, -16:], 20)[:, 16:])


def test_batch_rows_equal_single_rows(make_model):
    model = make_model(seed=12, block_size=40)
    idx = prompt(3, 6, seed=13)
    greedy = generate(model, idx, 30)
    sampled = generate(model, idx, 30, **SAMPLING, generator=[gen(100 + i) for i in range(3)])
    for row in range(3):
        assert torch.equal(greedy[row:row + 1], generate(model, idx[row:row + 1], 30))
        single = generate(model, idx[row:row + 1], 30, **SAMPLING, generator=gen(100 + row))
        assert torch.equal(sampled[row:row + 1], single)


def test_generate_tokens_streams_one_column_per_step(make_model):
    model = make_model(seed=14)
    idx = prompt(2, 4, seed=15)
    steps = list(generate_tokens(model, idx, 9))
    assert len(steps) == 9 and all(s.shape == (2,) and s.dtype == torch.long for s in steps)
    assert torch.equal(torch.stack(steps, dim=1), generate(model, idx, 9)[:, 4:])
    assert list(generate_tokens(model, idx, 0)) == []
    assert not torch.is_inference_mode_enabled()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0"),
        (dict(keep_fraction=0.0), r"keep_fraction must be in \(0, 1\]"),
        (dict(temperature=-1.0), "temperature must be a finite number >= 0"),
        (dict(top_k=0), "top_k must be a positive integer"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
        (dict(generator=[torch.Generator()] * 2), "got 2 generators for 1 rows"),
    ],
)
def test_bad_arguments_raise_before_iteration(make_model, kwargs, message):
    model = make_model()
    kwargs = {"max_new_tokens": 5, **kwargs}
    with pytest.raises(ValueError, match=message):
        generate_tokens(model, prompt(1, 3), **kwargs)  # no next(): raised at call time


def test_empty_or_malformed_prompt_raises(make_model):
    model = make_model()
    with pytest.raises(ValueError, match="non-empty"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="LongTensor"):
        generate(model, torch.zeros(1, 3, dtype=torch.int32), 3)
