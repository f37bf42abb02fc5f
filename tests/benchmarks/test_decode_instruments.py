"""The decode benchmarks' instruments on known cases: compiled and eager's token agreement, the 1-row
matmul bound's bookkeeping, and the round-by-round ratio of the ONNX Runtime goal. Reads no clock."""

import types

import pytest
import torch

from benchmarks import generate_speed
from benchmarks.speculative import grounded_prompts
from benchmarks.generate_speed import token_agreement
from benchmarks.shared import paired_ratio
from data.config import DataConfig
from data.sources.shakespeare import held_out_plays, shakespeare_documents
from data.tokenizer import train_tokenizer
from model.config import GPTConfig
from model.gpt import GPT


@pytest.mark.parametrize("compiled, eager, said", [
    ([5, 6, 7], [5, 6, 7], "compiled and eager chose the same 3 greedy tokens"),
    ([5, 6, 7, 8], [5, 6, 9, 8], "compiled and eager greedy tokens first differ at new token 2 of 4"),
    ([5, 6, 7], [5, 6], "compiled and eager greedy tokens first differ at new token 2 of 3"),  # one stopped early
])
def test_tokens_are_reported_the_same_or_where_they_part(compiled, eager, said):
    assert token_agreement(compiled, eager) == said


def test_the_one_row_bound_multiplies_every_weight_once_per_timing(monkeypatch):
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32)).eval()
    weights = generate_speed.linear_weights(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(weights) == len(linears) > 2 * 3  # each layer's products and the head
    calls = []
    real = generate_speed.F.linear
    monkeypatch.setattr(generate_speed.F, "linear", lambda x, w: calls.append((x.shape[0], w)) or real(x, w))
    assert generate_speed.one_row_matmul_rate(model) > 0
    assert len(calls) == 20 * len(weights)  # best of 20 timings
    assert all(rows == 1 for rows, _ in calls)
    assert [w.data_ptr() for _, w in calls[:len(weights)]] == [m.weight.data_ptr() for m in linears]


def test_a_path_faster_in_every_round_is_faster_round_by_round_however_the_load_drifts():
    peer = (100.0, 50.0, 80.0)  # the host slows, then recovers
    mine = tuple(1.1 * rate for rate in peer)
    assert paired_ratio(mine, peer) == pytest.approx((1.1, 1.1, 1.1))
    slower = tuple(0.9 * rate for rate in peer)
    assert paired_ratio(slower, peer)[0] == pytest.approx(0.9)
    with pytest.raises(ValueError):  # rounds of different counts
        paired_ratio((1.0, 2.0), (1.0,))
    # One quiet spell for the peer moves the best-of ratio, not the round-by-round one.
    mine = (110.0, 55.0, 88.0)
    peer = (100.0, 50.0, 121.0)  # the peer's third run met a quiet spell the others did not
    assert max(mine) / max(peer) < 1  # best of rounds: "slower"
    median, low, high = paired_ratio(mine, peer)
    assert median == pytest.approx(1.1) and low == pytest.approx(88 / 121) and high == pytest.approx(1.1)


def test_the_grounded_prompts_quote_held_out_plays_and_no_play_trained_on():
    ids, texts = shakespeare_documents()
    split = DataConfig()
    held_out = held_out_plays(split.val_fraction, split.split_seed)
    tokenizer = train_tokenizer(texts[:3], 300)
    run = types.SimpleNamespace(block_size=128, tokenizer=tokenizer)
    prompts = grounded_prompts(run, new_tokens=20, count=4)
    assert len(prompts) == 4 and all(len(p) <= 128 - 20 for p in prompts)
    for prompt in prompts:
        text = tokenizer.decode(prompt)
        passage, _, opening = text.rpartition("\n\n")
        sources = {play for play, play_text in zip(ids, texts) if passage[:80] in play_text}
        assert sources and sources <= held_out, sources
        # The prompt ends with the passage's opening again (one word of it in capitals for an edit).
        assert passage.lower().startswith(opening.lower())
