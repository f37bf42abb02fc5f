"""Grouped-query attention against the textbook formula and against torch's own MHA."""

import math

import pytest
import torch

import model.gpt as gqa
from model.config import GPTConfig
from model.kv_cache import KVCache
from model.gpt import CausalSelfAttention, causal_mask

N_HEAD = 6


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None):
    """softmax(QKᵀ/√d + mask)·V with K/V heads repeated explicitly: the slow, plain oracle.
    q: (B, n_head, Tq, d); k, v: (B, n_kv_head, Tk, d); mask: bool (Tq, Tk), True = allowed."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def make_layer(n_kv_head: int, seed: int = 0) -> CausalSelfAttention:
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=11, block_size=40, n_layer=1, n_head=N_HEAD, n_kv_head=n_kv_head, n_embd=42)
    layer = CausalSelfAttention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)  # large enough that attention weights are far from uniform
    return layer


def reference_layer(layer: CausalSelfAttention, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The layer's projections around reference_attention instead of SDPA."""
    return layer.proj(reference_attention(*layer.split_heads(x), mask).transpose(1, 2).reshape(x.shape))


def test_causal_mask_aligns_bottom_right():
    # Two newest queries of five positions: the first of them may not see the last key.
    expected = torch.tensor([[True, True, True, True, False], [True, True, True, True, True]])
    assert torch.equal(causal_mask(2, 5), expected)
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4).tril().bool())


@pytest.mark.parametrize("n_kv_head", [1, 2, N_HEAD])
@pytest.mark.parametrize("gqa_kernel", [True, False], ids=["enable_gqa", "repeat_fallback"])
def test_a_full_sequence_and_cached_chunks_and_single_tokens_match_reference(n_kv_head, gqa_kernel, monkeypatch):
    # Chunks on a filled cache take the bottom-right mask; one-token steps fold the query heads.
    monkeypatch.setattr(gqa, "SDPA_HAS_GQA", gqa_kernel)
    layer = make_layer(n_kv_head)
    x = torch.randn(3, 23, 42)
    cache = KVCache(1, 3, 40, layer.cache_entries())
    with torch.inference_mode():
        want = reference_layer(layer, x, causal_mask(23, 23))
        assert (layer(x) - want).abs().max().item() <= 1e-5
        pieces = []
        for start, end in [(0, 6), (6, 11), (11, 12), (12, 13), (13, 23)]:
            cache.begin(end - start)
            pieces.append(layer(x[:, start:end], cache))
            cache.end()
        _, k, v = layer.split_heads(x)
    assert (torch.cat(pieces, dim=1) - want).abs().max().item() <= 1e-5
    # The cache holds the key/value heads alone: (layers, batch, n_kv_head, max_len, head_dim).
    assert cache.buffers["k"].shape == (1, 3, n_kv_head, 40, 7)
    assert torch.equal(cache.buffers["k"][0, :, :, :23], k) and torch.equal(cache.buffers["v"][0, :, :, :23], v)


def test_mha_case_equals_torch_multihead_attention():
    layer = make_layer(N_HEAD, seed=2)
    mha = torch.nn.MultiheadAttention(42, N_HEAD, bias=False, batch_first=True).eval()
    with torch.no_grad():
        # Same layouts: in_proj stacks [Wq; Wk; Wv], and heads are contiguous slices of width d.
        mha.in_proj_weight.copy_(layer.qkv.weight)
        mha.out_proj.weight.copy_(layer.proj.weight)
    x = torch.randn(2, 19, 42)
    with torch.inference_mode():
        want, _ = mha(x, x, x, attn_mask=~causal_mask(19, 19), need_weights=False)  # True = blocked
        got = layer(x)
    assert (got - want).abs().max().item() <= 1e-5
