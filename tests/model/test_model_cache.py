"""KV cache: incremental logits equal full recomputation; memory, reset, and room."""

import pytest
import torch

import model.gpt as gpt
from model.kv_cache import KVCache
from run_testkit import ALL_OPTIONS

ATOL = 1e-5  # logits of a few units to a few tens (see conftest): two summation orders differ by ~1e-6

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


def test_a_pass_without_room_is_refused_before_writing(make_model):
    model = make_model()  # block_size 37
    cache = model.init_cache(2)
    with torch.inference_mode():
        model(torch.zeros(2, 30, dtype=torch.long), cache=cache)
        with pytest.raises(AssertionError, match="no room"):
            model(torch.zeros(2, 8, dtype=torch.long), cache=cache)
        assert cache.lengths == [30, 30]
        model(torch.zeros(2, 7, dtype=torch.long), cache=cache)  # exactly fills the table
        with pytest.raises(AssertionError, match="no room"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache, rows=[1])


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
