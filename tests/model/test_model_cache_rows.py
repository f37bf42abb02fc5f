"""One cache, rows at their own lengths: chunked prefill into one row, ragged decode steps."""

import pytest
import torch

from inference.batch_invariant import row_blocked
from run_testkit import ALL_OPTIONS

ATOL = 1e-5  # fp32 logits of a few units (see conftest): two summation orders differ by ~1e-6


def prefill(model, cache, r: int, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Encode ``ids`` into row r of ``cache`` in chunks; the logits after the last one."""
    chunk = chunk or len(ids)
    for start in range(0, len(ids), chunk):
        logits = model.next_token_logits(torch.tensor([ids[start:start + chunk]]), cache, [r])
    return logits


@pytest.mark.parametrize("overrides", [dict(n_kv_head=1), dict(n_kv_head=2), dict(n_kv_head=6),
                                       dict(n_kv_head=2, **ALL_OPTIONS), dict(n_kv_head=2, positions="rope"),
                                       dict(n_kv_head=2, positions="none", **ALL_OPTIONS)],
                         ids=["kv1", "kv2", "kv6", "options", "rope", "none-options"])
def test_rows_at_different_lengths_decode_as_each_would_alone(make_model, overrides):
    # head_dim 16: rows 64 bytes apart, as bit-exactness on the CPU needs (see _attend_token).
    model = row_blocked(make_model(seed=5, n_embd=96, **overrides))
    vocab, block = model.config.vocab_size, model.config.block_size
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (1, 7, 20, 3)]
    cache = model.init_cache(6, whole_buffers=True)
    rows = [4, 0, 2, 5]  # not in order, and with free rows between them
    solo_caches = [model.init_cache(1, whole_buffers=True) for _ in prompts]
    with torch.inference_mode():
        for r, prompt, solo in zip(rows, prompts, solo_caches):
            batched = prefill(model, cache, r, prompt)
            assert torch.equal(batched, prefill(model, solo, 0, prompt))
        tokens = [p[-1] for p in prompts]
        for _ in range(block - 20):
            idx = torch.tensor([[t] for t in tokens])
            step_logits = model.next_token_logits(idx, cache, rows)
            for i, solo in enumerate(solo_caches):
                alone = model.next_token_logits(idx[i:i + 1], solo)[0]
                assert torch.equal(step_logits[i], alone)  # bit for bit, not merely close
            tokens = step_logits.argmax(-1).tolist()
    assert [cache.lengths[r] for r in rows] == [s.lengths[0] for s in solo_caches]
    assert cache.lengths[1] == cache.lengths[3] == 0


EVEN_HEADS = dict(n_embd=48)  # head_dim 8: rotary positions turn pairs


@pytest.mark.parametrize("options", [{}, ALL_OPTIONS, dict(positions="rope", **EVEN_HEADS),
                                     dict(positions="rope", **EVEN_HEADS, **ALL_OPTIONS), dict(positions="none")],
                         ids=["plain", "options", "rope", "rope-options", "none"])
@pytest.mark.parametrize("batch_invariant", [False, True])
def test_ragged_rows_and_chunked_prefill_agree_with_full_recomputation(make_model, batch_invariant, options):
    model = make_model(seed=7, **options)
    served = row_blocked(model) if batch_invariant else model
    vocab = model.config.vocab_size
    seqs = [torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (7, 14, 12)]
    cache = model.init_cache(3, whole_buffers=batch_invariant)
    with torch.inference_mode():
        for r, seq in enumerate(seqs):
            prefill(served, cache, r, seq[:-6], chunk=3)
        for back in (6, 5, 4):  # three ragged one-token steps, rows given out of order
            rows = [2, 0, 1]
            idx = torch.tensor([[seqs[r][-back]] for r in rows])
            logits = served.next_token_logits(idx, cache, rows)
            for i, r in enumerate(rows):
                full = model.next_token_logits(torch.tensor([seqs[r][:len(seqs[r]) - back + 1]]))[0]
                assert (logits[i] - full).abs().max().item() <= ATOL
        got = model(torch.tensor([seq[-3:] for seq in seqs]), cache=cache)  # one pass, three lengths
        for i, seq in enumerate(seqs):
            assert (got[i] - model(torch.tensor([seq]))[0, -3:]).abs().max().item() <= ATOL
    assert cache.lengths == [len(s) for s in seqs]


def test_a_freed_row_is_reused_without_reading_old_keys(make_model):
    model = make_model(seed=8)
    cache = model.init_cache(2)
    with torch.inference_mode():
        prefill(model, cache, 0, list(range(30)))
        cache.reset([0])  # free it
        reused = prefill(model, cache, 0, [3, 4, 5])
        fresh = model.next_token_logits(torch.tensor([[3, 4, 5]]), model.init_cache(1))
    assert torch.equal(reused, fresh)


def test_a_full_row_or_repeated_rows_are_refused(make_model):
    model = make_model(seed=9)
    block = model.config.block_size
    cache = model.init_cache(2)
    with torch.inference_mode():
        prefill(model, cache, 0, [1] * block)
        prefill(model, cache, 1, [1])
        with pytest.raises(AssertionError, match="no room"):
            model.next_token_logits(torch.tensor([[1], [1]]), cache, [0, 1])
        with pytest.raises(AssertionError, match="distinct"):
            model.next_token_logits(torch.tensor([[1], [1]]), cache, [1, 1])


@pytest.mark.parametrize("whole_buffers", [False, True])
def test_ragged_rows_read_up_to_the_longest_row_unless_whole_buffers(make_model, whole_buffers):
    # Off the server, rows read only the slots up to the longest row's new token; with whole buffers,
    # every slot under their masks. NaN past the longest row tells which: a masked NaN still poisons.
    model = make_model(seed=4)
    cache = model.init_cache(2, whole_buffers=whole_buffers)
    with torch.inference_mode():
        model(torch.tensor([[1, 2, 3]]), cache=cache, rows=[0])
        model(torch.tensor([[4, 5, 6, 7, 8]]), cache=cache, rows=[1])
        for buffer in cache.buffers.values():
            buffer[:, :, :, 6:] = float("nan")
        logits = model.next_token_logits(torch.tensor([[9], [10]]), cache, [0, 1])
    assert logits.isnan().all() if whole_buffers else logits.isfinite().all()
