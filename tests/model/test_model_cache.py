"""KV cache: incremental logits equal full recomputation; memory, reset, and room; and one cache whose rows
sit at their own lengths: chunked prefill into one row, ragged decode steps."""

import pytest
import torch

import model.gpt as gpt
from inference.batch_invariant import row_blocked
from model.kv_cache import KVCache
from run_testkit import ALL_OPTIONS, MLA_OPTIONS

ATOL = 1e-5  # logits of a few units to a few tens (see conftest): two summation orders differ by ~1e-6
MLA = dict(attention="mla", n_kv_head=6, kv_latent_dim=8, q_latent_dim=24)  # latent attention (n_head 6)

CONFIGS = [
    dict(n_kv_head=1), dict(n_kv_head=2), dict(n_kv_head=6),
    dict(n_kv_head=3, n_head=3, n_embd=33, vocab_size=61, n_layer=3, block_size=29, tie_embeddings=False),
    # Value embeddings with an explicit feed-forward width, and value embeddings on three layers.
    dict(n_kv_head=2, **ALL_OPTIONS),
    dict(n_kv_head=2, n_layer=3, value_embeddings=True),
    # Rotary positions and none (an even head, 8, for rotary pairs), alone and with the options.
    dict(n_kv_head=2, n_embd=48, positions="rope"),
    dict(n_kv_head=1, n_embd=48, positions="rope", rope_theta=500.0, tie_embeddings=False),
    dict(n_kv_head=2, n_embd=48, positions="rope", **ALL_OPTIONS),
    dict(n_kv_head=6, n_embd=48, positions="none"),
    dict(n_kv_head=2, n_embd=48, positions="none", **ALL_OPTIONS),
    # Latent attention (head_dim 16): kv_latent_dim below, equal to and above it, with and without a query
    # latent, with the width option, and with rotary positions (the decoupled rotary key) or none.
    *[dict(MLA, n_embd=96, kv_latent_dim=kv, q_latent_dim=q, **options) for kv, q, options in [
        (8, None, {}), (16, 24, {}), (48, None, {}), (48, 8, {}), (16, 24, MLA_OPTIONS),
        (8, None, {"positions": "rope"}), (48, 8, {"positions": "rope", "rope_theta": 100.0}),
        (16, 24, {"positions": "rope", **MLA_OPTIONS}), (16, None, {"positions": "none"})]],
]


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
def test_prefill_decode_uneven_chunks_single_rows_and_a_reset_match_full_forward(make_model, overrides):
    model = make_model(seed=3, **overrides)
    block = model.config.block_size
    seq = torch.randint(0, model.config.vocab_size, (2, block), generator=torch.Generator().manual_seed(4))
    cache = model.init_cache(2)
    with torch.inference_mode():
        steps = [model(seq[:, :5], cache=cache)]
        assert max_err(steps[0], model(seq[:, :5])) <= ATOL
        for t in range(5, block):  # up to the very last position of the table
            steps.append(model(seq[:, t:t + 1], cache=cache))
            assert max_err(steps[-1][:, -1], model(seq[:, : t + 1])[:, -1]) <= ATOL, f"position {t}"
        assert cache.lengths == [block, block]
        for row in range(2):  # each row of the batch as its sequence alone
            alone = model.init_cache(1)
            single = [model(seq[row:row + 1, :5], cache=alone)] + [
                model(seq[row:row + 1, t:t + 1], cache=alone) for t in range(5, block)]
            assert max_err(torch.cat(steps, dim=1)[row:row + 1], torch.cat(single, dim=1)) <= ATOL
        # A reset cache still holds the whole table of the first sequences; a second, shorter one
        # rewrites only its own positions, in uneven chunks.
        cache.reset()
        pieces, start = [], 0
        for size in (3, 5, 1, 7, 2):
            pieces.append(model(seq[:, start:start + size].flip(0), cache=cache))
            start += size
        assert max_err(torch.cat(pieces, dim=1), model(seq[:, :18].flip(0))) <= ATOL


def test_buffers_are_preallocated_and_written_in_place(make_model):
    model = make_model(n_kv_head=2)
    cache = model.init_cache(2, max_len=30)
    k_ptr, v_ptr = cache.buffers["k"].data_ptr(), cache.buffers["v"].data_ptr()
    with torch.inference_mode():
        model(torch.zeros(2, 10, dtype=torch.long), cache=cache)
        for _ in range(5):
            model(torch.zeros(2, 1, dtype=torch.long), cache=cache)
    assert (cache.buffers["k"].data_ptr(), cache.buffers["v"].data_ptr()) == (k_ptr, v_ptr)
    assert cache.buffers["k"][1].shape == (2, 2, 30, 7)  # layer 1: (B, n_kv_head, max_len, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_match_formula_and_gqa_ratio(make_model, dtype):
    n_layer, batch, max_len, head_dim = 2, 3, 25, 7
    sizes = {}
    for n_kv_head in (1, 2, 6):
        cache = make_model(n_kv_head=n_kv_head).init_cache(batch, max_len=max_len, dtype=dtype)
        elem = torch.tensor([], dtype=dtype).element_size()
        assert cache.nbytes() == 2 * n_layer * batch * n_kv_head * max_len * head_dim * elem
        sizes[n_kv_head] = cache.nbytes()
    assert sizes[2] * 6 == sizes[6] * 2 and sizes[1] * 6 == sizes[6]


def test_a_pass_without_room_or_with_repeated_rows_is_refused_before_writing(make_model):
    model = make_model()  # block_size 37
    cache = model.init_cache(2)
    with torch.inference_mode():
        model(torch.zeros(2, 30, dtype=torch.long), cache=cache)
        with pytest.raises(AssertionError, match="no room"):
            model(torch.zeros(2, 8, dtype=torch.long), cache=cache)
        assert cache.lengths == [30, 30]
        model(torch.zeros(2, 7, dtype=torch.long), cache=cache)  # exactly fills the table
        cache.reset([1])
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache, rows=[1])
        for rows in ([0], [0, 1]):  # the full row alone, or a ragged step beside a row with room
            with pytest.raises(AssertionError, match="no room"):
                model.next_token_logits(torch.ones(len(rows), 1, dtype=torch.long), cache, rows)
        with pytest.raises(AssertionError, match="distinct"):
            model.next_token_logits(torch.ones(2, 1, dtype=torch.long), cache, [1, 1])


def test_standalone_cache_reports_its_shape_and_lengths():
    cache = KVCache(n_layer=3, batch_size=2, max_len=9, entries={"k": (4, 5), "v": (4, 5)})
    assert cache.nbytes() == 2 * 3 * 2 * 4 * 9 * 5 * 4
    assert cache.buffers["v"].shape == (3, 2, 4, 9, 5) and cache.lengths == [0, 0]
    cache.begin(4, rows=[1])
    cache.end()
    assert cache.lengths == [0, 4]
    cache.reset([1])
    assert cache.lengths == [0, 0]


@pytest.mark.parametrize("overrides", [dict(n_kv_head=2), dict(n_kv_head=1)], ids=["gqa", "mqa"])
def test_decoding_holds_when_attention_returns_another_memory_layout(make_model, monkeypatch, overrides):
    """CUDA's attention may return its heads in another memory order (an H200's one-token GQA step gave
    strides (64, 16, 32, 1), which a .view() refused); the CPU never does, so here every output is given
    that layout. (Latent attention only splits its one head axis, which any layout allows.)"""
    plain = gpt.F.scaled_dot_product_attention
    permuted_layout = lambda *a, **k: plain(*a, **k).transpose(1, 2).contiguous().transpose(1, 2)  # noqa: E731
    model = make_model(seed=3, **overrides)
    seq = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        full = model(seq)
        monkeypatch.setattr(gpt.F, "scaled_dot_product_attention", permuted_layout)
        cache = model.init_cache(2)
        pieces = [model(seq[:, :5], cache=cache)] + [model(seq[:, t:t + 1], cache=cache) for t in range(5, 12)]
    assert max_err(torch.cat(pieces, dim=1), full) <= ATOL


def prefill(model, cache, r: int, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """Encode ``ids`` into row r of ``cache`` in chunks; the logits after the last one."""
    chunk = chunk or len(ids)
    for start in range(0, len(ids), chunk):
        logits = model.next_token_logits(torch.tensor([ids[start:start + chunk]]), cache, [r])
    return logits


@pytest.mark.parametrize("overrides", [dict(n_kv_head=1), dict(n_kv_head=2), dict(n_kv_head=6),
                                       dict(n_kv_head=2, **ALL_OPTIONS), dict(n_kv_head=2, positions="rope"),
                                       dict(n_kv_head=2, positions="none", **ALL_OPTIONS), MLA | dict(kv_latent_dim=16),
                                       MLA | dict(kv_latent_dim=16, **MLA_OPTIONS), MLA | dict(positions="rope")],
                         ids=["kv1", "kv2", "kv6", "options", "rope", "none-options", "mla", "mla-options", "mla-rope"])
def test_rows_at_different_lengths_decode_as_each_would_alone(make_model, overrides):
    # head_dim 16: rows 64 bytes apart, as bit-exactness on the CPU needs (see _attend_token); latent
    # attention's cached vector, kv_latent_dim (+ the rotary key's 8), a multiple of 16 as well.
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
OPTIONS = [{}, ALL_OPTIONS, dict(positions="rope", **EVEN_HEADS), dict(positions="rope", **EVEN_HEADS, **ALL_OPTIONS),
           dict(positions="none")]
OPTION_IDS = ["plain", "options", "rope", "rope-options", "none"]


# The same with latent attention (its options the width alone): its chunks take the expanded form, its
# one-token steps the absorbed one.
MLA_ROWS = [MLA | {key: value for key, value in options.items() if key != "value_embeddings"} for options in OPTIONS]


@pytest.mark.parametrize("options", OPTIONS + MLA_ROWS, ids=OPTION_IDS + [f"mla-{i}" for i in OPTION_IDS])
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
                assert max_err(logits[i], full) <= ATOL
        got = model(torch.tensor([seq[-3:] for seq in seqs]), cache=cache)  # one pass, three lengths
        for i, seq in enumerate(seqs):
            assert max_err(got[i], model(torch.tensor([seq]))[0, -3:]) <= ATOL
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
