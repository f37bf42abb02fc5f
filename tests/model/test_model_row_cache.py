"""RowCache: rows at different lengths decode together, each as it would alone."""

from __future__ import annotations

import pytest
import torch

from model import RowCache
from model.gpt import batch_invariant

ATOL = 1e-5  # fp32 logits of a few units (see conftest): two summation orders differ by ~1e-6


def new_row_cache(model, rows: int) -> RowCache:
    return RowCache(model.init_cache(rows))


def prefill(model, cache: RowCache, r: int, ids: list[int]) -> torch.Tensor:
    view = cache.row(r)
    logits = model.next_token_logits(torch.tensor([ids]), view)
    cache.lengths[r] = view.pos
    return logits


@pytest.mark.parametrize("n_kv_head", [1, 2, 6])
def test_rows_at_different_lengths_decode_as_each_would_alone(make_model, n_kv_head):
    # head_dim 16: rows 64 bytes apart, as bit-exactness on the CPU needs (see _attend_token).
    model = make_model(seed=5, n_kv_head=n_kv_head, n_embd=96)
    vocab, block = model.config.vocab_size, model.config.block_size
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (1, 7, 20, 3)]
    cache = new_row_cache(model, 6)
    rows = [4, 0, 2, 5]  # not in order, and with free rows between them
    solo_caches = [model.init_cache(1) for _ in prompts]
    with torch.inference_mode(), batch_invariant():
        for r, prompt, solo in zip(rows, prompts, solo_caches):
            batched = prefill(model, cache, r, prompt)
            assert torch.equal(batched, model.next_token_logits(torch.tensor([prompt]), solo))
        tokens = [p[-1] for p in prompts]
        for _ in range(block - 20):
            step_logits = model.next_token_logits(torch.tensor([[t] for t in tokens]), cache.step(rows))
            for i, solo in enumerate(solo_caches):
                alone = model.next_token_logits(torch.tensor([[tokens[i]]]), solo)[0]
                assert torch.equal(step_logits[i], alone)  # bit for bit, not merely close
            tokens = step_logits.argmax(-1).tolist()
    assert [cache.lengths[r] for r in rows] == [s.pos for s in solo_caches]
    assert cache.lengths[1] == cache.lengths[3] == 0


def test_a_row_step_uses_each_rows_position_and_full_recompute_agrees(make_model):
    model = make_model(seed=7)
    vocab = model.config.vocab_size
    seqs = [torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (4, 11)]
    cache = new_row_cache(model, 2)
    with torch.inference_mode():
        for r, seq in enumerate(seqs):
            prefill(model, cache, r, seq[:-1])
        logits = model.next_token_logits(torch.tensor([[s[-1]] for s in seqs]), cache.step([0, 1]))
        for i, seq in enumerate(seqs):
            full = model.next_token_logits(torch.tensor([seq]))[0]
            assert (logits[i] - full).abs().max().item() <= ATOL


def test_a_freed_row_is_reused_without_reading_old_keys(make_model):
    model = make_model(seed=8)
    cache = new_row_cache(model, 2)
    with torch.inference_mode():
        prefill(model, cache, 0, list(range(30)))
        cache.lengths[0] = 0  # free it
        reused = prefill(model, cache, 0, [3, 4, 5])
        fresh = model.next_token_logits(torch.tensor([[3, 4, 5]]), model.init_cache(1))
    assert torch.equal(reused, fresh)


def test_a_full_row_or_a_wrong_shape_is_refused(make_model):
    model = make_model(seed=9)
    block = model.config.block_size
    cache = new_row_cache(model, 2)
    with torch.inference_mode():
        prefill(model, cache, 0, [1] * block)
        prefill(model, cache, 1, [1])
        with pytest.raises(ValueError, match=r"rows \[0\] already hold"):
            model.next_token_logits(torch.tensor([[1], [1]]), cache.step([0, 1]))
        with pytest.raises(ValueError, match="one token for each of its 1 rows"):
            model.next_token_logits(torch.tensor([[1, 2]]), cache.step([1]))
    with pytest.raises(ValueError, match="distinct"):
        cache.step([1, 1])
