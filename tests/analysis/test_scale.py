"""Experiment 2, the 1/√d scale: the scaled weights are the model's own, the unscaled ones are what
attention would apply to the same scores without the scale, and dropping the scale only ever
sharpens a row (lower entropy, a larger largest weight)."""

import pytest
import torch
import torch.nn.functional as F

from analysis.maps import describe_attention, scale_comparison
from analysis.roles import attention_entropy
from model import GPT, GPTConfig

KINDS = {
    "gqa": dict(n_kv_head=2),
    "mla": dict(n_kv_head=4, attention="mla", kv_latent_dim=12),
}
T = 15


@pytest.fixture(params=list(KINDS))
def model(request):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=60, block_size=24, n_layer=2, n_head=4, n_embd=32, **KINDS[request.param])
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # scores far from zero, so that the scale changes the rows visibly
    return model


def ids():
    return torch.randint(0, 60, (1, T), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("layer, head", [(0, 0), (1, 3)])
def test_the_scaled_weights_are_the_models_own(model, layer, head):
    comparison = scale_comparison(model, ids(), layer, head)
    torch.testing.assert_close(comparison.scaled, model.attention_weights(ids())[layer][0, head], atol=1e-6, rtol=0)
    assert comparison.head_dim == model.config.n_embd // model.config.n_head


def test_both_match_sdpa_with_its_own_scale_and_with_none(model):
    """SDPA applied to an identity matrix of values returns its attention weights: with its default
    scale they are the scaled map, with scale=1 the unscaled one."""
    q, k = model.attention_queries_keys(ids())[1]
    q, k = q[:, 2:3], k[:, 2:3]
    eye = torch.eye(T).expand(1, 1, T, T)
    comparison = scale_comparison(model, ids(), layer=1, head=2)
    torch.testing.assert_close(comparison.scaled, F.scaled_dot_product_attention(q, k, eye, is_causal=True)[0, 0],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(comparison.unscaled,
                               F.scaled_dot_product_attention(q, k, eye, is_causal=True, scale=1.0)[0, 0],
                               atol=1e-5, rtol=0)


def test_without_the_scale_every_row_is_sharper(model):
    for layer in range(model.config.n_layer):
        for head in range(model.config.n_head):
            c = scale_comparison(model, ids(), layer, head)
            future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            assert torch.count_nonzero(c.unscaled[future]) == 0
            torch.testing.assert_close(c.unscaled.sum(-1), torch.ones(T), atol=1e-6, rtol=0)
            row_bits = attention_entropy(c.scaled.unsqueeze(-2)).squeeze(-1)  # one entropy per query
            unscaled_bits = attention_entropy(c.unscaled.unsqueeze(-2)).squeeze(-1)
            assert bool((unscaled_bits <= row_bits + 1e-5).all())
            assert bool((c.unscaled.max(-1).values >= c.scaled.max(-1).values - 1e-6).all())
            scaled_mean, unscaled_mean = c.entropy_bits()
            assert unscaled_mean < scaled_mean


@pytest.mark.parametrize("fields, label", [
    (dict(n_kv_head=4), "MHA, 4 KV heads"),
    (dict(n_kv_head=2), "GQA, 2 KV heads"),
    (dict(n_kv_head=1), "MQA, 1 KV head"),
    (dict(n_kv_head=4, attention="mla", kv_latent_dim=64), "MLA, latent 64"),
    (dict(n_kv_head=4, attention="mla", kv_latent_dim=32, q_latent_dim=48), "MLA, latent 32, query latent 48"),
])
def test_each_attention_kind_is_named(fields, label):
    config = GPTConfig(vocab_size=60, block_size=24, n_layer=2, n_head=4, n_embd=32, **fields)
    assert describe_attention(config) == label
