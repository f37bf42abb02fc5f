"""The small-model options of GPTConfig, one by one: what each computes, its size, its init, and
its config errors. The cache, generation and export tests run them too (``ALL_OPTIONS``)."""

from __future__ import annotations

import json

import pytest
import torch

from common.config import ConfigError
from model import GPT, GPTConfig
from run_testkit import ALL_OPTIONS, MLA_OPTIONS

SHAPE = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
MLA = dict(attention="mla", n_kv_head=4, kv_latent_dim=16)


@pytest.mark.parametrize("n_embd", [64, 128, 200])
def test_relu2_is_as_large_as_swiglu_at_the_same_width(n_embd):
    swiglu = GPTConfig(**SHAPE | dict(n_embd=n_embd, n_head=2, n_kv_head=2))
    relu2 = GPTConfig(**SHAPE | dict(n_embd=n_embd, n_head=2, n_kv_head=2, mlp="relu2"))
    assert relu2.ffn_dim * 2 == swiglu.ffn_dim * 3
    assert relu2.num_params() == swiglu.num_params()
    assert GPT(relu2).num_params() == GPT(swiglu).num_params()


@pytest.mark.parametrize("options", [ALL_OPTIONS, MLA_OPTIONS | MLA, dict(mlp="relu2", ffn_hidden=100),
                                     ALL_OPTIONS | dict(positions="rope"), MLA_OPTIONS | MLA | dict(positions="rope"),
                                     dict(positions="none")],
                         ids=["gqa", "mla", "relu2-hidden", "gqa-rope", "mla-rope", "none"])
def test_parameter_count_from_the_config_matches_the_model(options):
    config = GPTConfig(**SHAPE | options)
    model = GPT(config)
    assert config.num_params() == model.num_params()
    assert hasattr(model, "pos_emb") == (config.positions == "learned")  # rope and none have no table


@pytest.mark.parametrize("changes,words", [
    ({"mlp": "gelu"}, "mlp must be one of swiglu, relu2, got 'gelu'"),
    ({"logit_softcap": 0}, "logit_softcap must be a positive number"),
    ({"logit_softcap": -15.0}, "logit_softcap must be a positive number"),
    ({"logit_softcap": float("inf")}, "or null to turn it off"),
    ({"qk_norm": "yes"}, "qk_norm must be true or false"),
    ({"residual_scalars": 1}, "residual_scalars must be true or false"),
    ({"value_embeddings": True, **MLA}, "value_embeddings needs attention gqa"),
])
def test_bad_option_values_get_one_clear_line(changes, words):
    with pytest.raises(ConfigError) as error:
        GPTConfig.from_dict(SHAPE | changes)
    assert words in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError):  # and the dataclass refuses it too
        GPTConfig(**SHAPE | changes)


def test_a_config_saved_before_the_options_loads_with_every_option_off():
    config = GPTConfig.from_dict(json.loads(json.dumps(SHAPE)))  # a model_config.json without the keys
    assert (config.mlp, config.qk_norm, config.logit_softcap, config.residual_scalars, config.value_embeddings,
            config.zero_init) == ("swiglu", False, None, False, False, False)
    with_options = GPTConfig(**SHAPE | ALL_OPTIONS)
    assert GPTConfig.from_dict(json.loads(json.dumps(with_options.to_dict()))) == with_options


def test_softcap_bounds_the_logits_and_the_loss_reads_the_capped_ones(make_model):
    model = make_model(seed=1, logit_softcap=0.5)
    plain = make_model(seed=1)  # the same weights without the cap
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, loss = model(idx, idx)
        raw = plain(idx)
    assert logits.abs().max() < 0.5 < raw.abs().max()
    torch.testing.assert_close(logits, 0.5 * torch.tanh(raw / 0.5))
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()))
    torch.testing.assert_close(model.next_token_logits(idx), logits[:, -1])


def test_residual_scalars_start_as_the_plain_residual_stream():
    torch.manual_seed(0)
    scaled = GPT(GPTConfig(**SHAPE, residual_scalars=True))
    plain = GPT(GPTConfig(**SHAPE))
    plain.load_state_dict({k: v for k, v in scaled.state_dict().items() if "lambdas" not in k})
    idx = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(scaled(idx), plain(idx), rtol=0, atol=0)
        scaled.x0_lambdas.fill_(0.5)  # and the embedding output is mixed in once λ_0 moves
        assert not torch.allclose(scaled(idx), plain(idx))


@pytest.mark.parametrize("tie", [True, False])
def test_zero_init_zeroes_the_output_projections_and_an_untied_head(tie):
    model = GPT(GPTConfig(**SHAPE, zero_init=True, tie_embeddings=tie))
    for block in model.blocks:
        assert not block.attn.proj.weight.any() and not block.ffn.down.weight.any()
        assert block.attn.qkv.weight.any()
    assert model.lm_head.weight.any() == tie  # a tied head is the embedding: never zero
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.randint(0, 97, (4, 16), generator=torch.Generator().manual_seed(3))
    losses = []
    for _ in range(8):  # every weight gets gradient within a couple of steps: the loss falls
        _, loss = model(idx, idx)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1
    assert all(block.attn.proj.weight.any() for block in model.blocks)


@pytest.mark.parametrize("n_layer,layers", [(1, (0,)), (2, (1,)), (3, (0, 2)), (4, (1, 3))])
def test_value_embeddings_sit_on_alternate_layers_ending_with_the_last(n_layer, layers):
    config = GPTConfig(**SHAPE | dict(n_layer=n_layer, value_embeddings=True))
    model = GPT(config)
    assert tuple(config.value_embedding_layers) == layers and sorted(map(int, model.value_embs)) == list(layers)
    assert [i for i, block in enumerate(model.blocks) if hasattr(block.attn, "value_gate")] == list(layers)
    # Embedding tables: left out of the non-embedding count, as the token table is.
    tables = sum(model.value_embs[str(i)].weight.numel() for i in layers)
    assert model.num_params() - model.num_params(include_embeddings=False) == tables + (97 + 16) * 64


def test_value_embeddings_change_only_the_values_of_their_layers(make_model):
    model = make_model(seed=4, n_layer=3, value_embeddings=True)
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = model(idx)
        model.value_embs["2"].weight.zero_()  # the last layer's values lose their embedding term
        assert not torch.allclose(model(idx), before)
        model.value_embs["0"].weight.zero_()  # with both tables at zero, the gates add nothing
        zeroed = model(idx)
    plain = make_model(seed=4, n_layer=3)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if "value_" not in k})
    with torch.no_grad():
        torch.testing.assert_close(plain(idx), zeroed)
