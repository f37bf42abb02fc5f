"""The drawn weights are the model's own, for both attention kinds, and the 1/√d scale's comparison."""

import pytest
import torch
import torch.nn.functional as F

from analysis.maps import describe_attention, scale_comparison
from analysis.roles import attention_entropy

from model.config import GPTConfig
from model.gpt import GPT

KINDS = {
    "gqa": dict(n_kv_head=2),
    "mla": dict(n_kv_head=4, attention="mla", kv_latent_dim=12),
    "mla-qlatent": dict(n_kv_head=4, attention="mla", kv_latent_dim=24, q_latent_dim=16),
    # Rotary positions: the maps score the rotated queries and keys (with latent attention, the
    # decoupled rotary part beside each head), and none.
    "gqa-rope": dict(n_kv_head=2, positions="rope"),
    "mla-rope": dict(n_kv_head=4, attention="mla", kv_latent_dim=12, positions="rope"),
    "gqa-none": dict(n_kv_head=2, positions="none"),
}


@pytest.fixture(params=list(KINDS))
def model(request):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=60, block_size=24, n_layer=3, n_head=4, n_embd=32, **KINDS[request.param])
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # weights far from uniform, so a wrong map cannot pass by accident
    return model


def ids(batch=2, T=17, seed=1):
    return torch.randint(0, 60, (batch, T), generator=torch.Generator().manual_seed(seed))


def test_rows_sum_to_one_the_future_is_zero_and_no_row_or_later_token_moves_them(model):
    weights = model.attention_weights(ids())
    assert len(weights) == model.config.n_layer
    for w in weights:
        assert w.shape == (2, 4, 17, 17)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 17), atol=1e-6, rtol=0)
        future = torch.triu(torch.ones(17, 17, dtype=torch.bool), diagonal=1)
        assert torch.count_nonzero(w[..., future]) == 0
        assert bool((w[..., ~future] > 0).all())  # softmax never gives exactly zero where allowed
    # Row 0 alone gives its maps in the batch, and a prefix's maps are the longer sequence's top-left corner.
    batch = model.attention_weights(ids())
    alone = model.attention_weights(ids()[:1])
    prefix = model.attention_weights(ids()[:1, :9])
    for b, a, p in zip(batch, alone, prefix):
        torch.testing.assert_close(b[:1], a, atol=1e-6, rtol=0)
        torch.testing.assert_close(a[..., :9, :9], p, atol=1e-6, rtol=0)
    # Dropout is left out, and the model stays in its mode.
    from analysis.roles import attention_maps

    model.train()
    first = attention_maps(model, ids())
    assert model.training
    torch.testing.assert_close(first[0], attention_maps(model, ids())[0])


def test_weights_times_values_reproduce_each_layer_output(model):
    x = model.tok_emb(ids())
    if model.config.positions == "learned":
        x = x + model.pos_emb.weight[:17]
    rotation = model.rotation(17)  # rotary positions only
    weights = model.attention_weights(ids())
    with torch.no_grad():
        for block, w in zip(model.blocks, weights):
            h = block.attn_norm(x)
            _, _, v = block.attn.per_head(h, rotation)
            B, H, T, d = v.shape
            mixed = (w @ v).transpose(1, 2).reshape(B, T, H * d)
            torch.testing.assert_close(block.attn.proj(mixed), block.attn(h, None, None, rotation),
                                       atol=1e-5, rtol=1e-5)
            x = block(x, rotation=rotation)


def test_without_positions_attention_cannot_tell_order_and_with_them_it_can(model):
    """With no position embedding the last token reads its prefix as a set (shuffling it changes nothing);
    with learned positions it changes: why the model adds positions at the input."""
    if model.config.positions != "learned":
        pytest.skip("rotary and no positions add nothing at the input, which is what this test takes away")
    tokens = ids(batch=1, T=12)
    shuffled = torch.cat([tokens[:, :11][:, torch.randperm(11, generator=torch.Generator().manual_seed(4))],
                          tokens[:, 11:]], dim=1)
    assert not torch.equal(tokens, shuffled)
    block = model.blocks[0]
    with torch.no_grad():
        def last_output(t, positions):
            x = model.tok_emb(t) + (model.pos_emb.weight[:12] if positions else 0)
            return block.attn(block.attn_norm(x))[:, -1]
        torch.testing.assert_close(last_output(tokens, False), last_output(shuffled, False), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(last_output(tokens, True), last_output(shuffled, True), atol=1e-3)


T = 15  # the length the scale tests use


@pytest.mark.parametrize("layer, head", [(0, 0), (2, 3)])
def test_the_scaled_weights_are_the_models_own(model, layer, head):
    comparison = scale_comparison(model, ids(batch=1, T=T), layer, head)
    own = model.attention_weights(ids(batch=1, T=T))[layer][0, head]
    torch.testing.assert_close(comparison.scaled, own, atol=1e-6, rtol=0)
    # The d of 1/√d is the width of the dot product: latent attention's rotary part is in it.
    cfg = model.config
    assert comparison.head_dim == cfg.n_embd // cfg.n_head + (cfg.rope_dim if cfg.attention == "mla" else 0)


def test_both_match_sdpa_with_its_own_scale_and_with_none(model):
    """SDPA applied to an identity matrix of values returns its attention weights: with its default
    scale they are the scaled map, with scale=1 the unscaled one."""
    q, k = model.attention_queries_keys(ids(batch=1, T=T))[1]
    q, k = q[:, 2:3], k[:, 2:3]
    eye = torch.eye(T).expand(1, 1, T, T)
    comparison = scale_comparison(model, ids(batch=1, T=T), layer=1, head=2)
    torch.testing.assert_close(comparison.scaled, F.scaled_dot_product_attention(q, k, eye, is_causal=True)[0, 0],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(comparison.unscaled,
                               F.scaled_dot_product_attention(q, k, eye, is_causal=True, scale=1.0)[0, 0],
                               atol=1e-5, rtol=0)


def test_without_the_scale_every_row_is_sharper(model):
    for layer in range(model.config.n_layer):
        for head in range(model.config.n_head):
            c = scale_comparison(model, ids(batch=1, T=T), layer, head)
            future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            assert torch.count_nonzero(c.unscaled[future]) == 0
            torch.testing.assert_close(c.unscaled.sum(-1), torch.ones(T), atol=1e-6, rtol=0)
            scaled_bits = attention_entropy(c.scaled.unsqueeze(-2))  # each row alone: one entropy per query
            unscaled_bits = attention_entropy(c.unscaled.unsqueeze(-2))
            assert bool((unscaled_bits <= scaled_bits + 1e-5).all())
            assert bool((c.unscaled.max(-1).values >= c.scaled.max(-1).values - 1e-6).all())
            scaled_mean, unscaled_mean = c.entropy_bits()
            assert unscaled_mean < scaled_mean


@pytest.mark.parametrize("fields, label", [
    (dict(n_kv_head=4), "MHA, 4 KV heads"),
    (dict(n_kv_head=2), "GQA, 2 KV heads"),
    (dict(n_kv_head=1), "MQA, 1 KV head"),
    (dict(n_kv_head=4, attention="mla", kv_latent_dim=64), "MLA, latent 64"),
    (dict(n_kv_head=4, attention="mla", kv_latent_dim=32, q_latent_dim=48), "MLA, latent 32, query latent 48"),
    (dict(n_kv_head=2, positions="rope"), "GQA, 2 KV heads, rotary positions"),
    (dict(n_kv_head=4, attention="mla", kv_latent_dim=64, positions="none"), "MLA, latent 64, no positions"),
])
def test_each_attention_kind_is_named(fields, label):
    config = GPTConfig(vocab_size=60, block_size=24, n_layer=2, n_head=4, n_embd=32, **fields)
    assert describe_attention(config) == label
