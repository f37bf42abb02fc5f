"""The engine's synchronous ``decode``: cached == uncached (the whole window recomputed for every
token) token for token, greedy and sampled, within and past block_size, batched and single."""

import pytest
import torch

from inference.engine import decode
from inference.sampling import KEEP_FRACTION, SamplingSettings
from run_testkit import ALL_OPTIONS

SAMPLING = dict(temperature=0.9, top_k=40, top_p=0.95, repetition_penalty=1.3)


def prompt(batch: int, length: int, seed: int = 0, vocab: int = 97) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def generate(model, idx: torch.Tensor, max_new_tokens: int, *, seed: int = 0, use_cache: bool = True,
             keep_fraction: float = KEEP_FRACTION, **sampling) -> torch.Tensor:
    """``idx`` (B, T) followed by the tokens ``decode`` gives each row (row i seeded seed + i);
    greedy unless ``sampling`` says otherwise."""
    settings = SamplingSettings(max_new_tokens=max_new_tokens, **{"temperature": 0.0, "top_p": None, **sampling},
                                seed=seed)
    finishes = decode(model, idx.tolist(), settings, use_cache=use_cache, keep_fraction=keep_fraction)
    return torch.cat([idx, torch.tensor([f.token_ids for f in finishes])], dim=1)


@pytest.mark.parametrize("overrides", [dict(n_kv_head=1), dict(n_kv_head=2), dict(n_kv_head=6),
                                       dict(n_kv_head=2, **ALL_OPTIONS)], ids=["kv1", "kv2", "kv6", "options"])
def test_greedy_with_the_cache_equals_a_plain_argmax_loop(make_model, overrides):  # independent of the engine
    model = make_model(seed=1, block_size=80, **overrides)
    seq = prompt(2, 6)
    out = generate(model, seq, 70)
    with torch.inference_mode():
        for _ in range(70):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq) and len(set(out[0, 6:].tolist())) > 5  # a real continuation, not one id


@pytest.mark.parametrize("keep_fraction", [0.5, 0.25, 1.0])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_past_block_size_cached_equals_uncached(make_model, keep_fraction, sampled):
    model = make_model(seed=6, block_size=16, n_kv_head=3)
    idx = prompt(2, 5, seed=7)
    kwargs = dict(SAMPLING) if sampled else {}
    runs = [
        generate(model, idx, 48, **kwargs, use_cache=use_cache, keep_fraction=keep_fraction, seed=21)
        for use_cache in (True, False)
    ]
    assert runs[0].shape == (2, 5 + 48) and torch.equal(runs[0], runs[1])
    if sampled:  # the seed is what the draws follow
        assert not torch.equal(runs[0], generate(model, idx, 48, **kwargs, keep_fraction=keep_fraction, seed=22))


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
    sampled = generate(model, idx, 30, **SAMPLING, seed=100)
    for row in range(3):
        assert torch.equal(greedy[row:row + 1], generate(model, idx[row:row + 1], 30))
        single = generate(model, idx[row:row + 1], 30, **SAMPLING, seed=100 + row)
        assert torch.equal(sampled[row:row + 1], single)


def test_decode_streams_one_event_per_token_of_each_row(make_model):
    model = make_model(seed=14)
    idx = prompt(2, 4, seed=15)
    events: list[tuple[int, int | None]] = []
    finishes = decode(model, idx.tolist(), SamplingSettings(max_new_tokens=9, temperature=0.0),
                      on_event=lambda row, event: events.append((row, event.token_id)))
    for row, finish in enumerate(finishes):
        assert [t for r, t in events if r == row] == list(finish.token_ids)
        assert finish.reason == "length" and finish.token_ids == tuple(generate(model, idx, 9)[row, 4:].tolist())
    assert all(f.token_ids == () for f in decode(model, idx.tolist(), SamplingSettings(max_new_tokens=0)))
    assert not torch.is_inference_mode_enabled()
