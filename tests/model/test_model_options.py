"""The model options of GPTConfig: the parameter count for each shape, value embeddings (what they
compute, their size, their init) and their config errors. The cache, generation and export tests run
them too (``ALL_OPTIONS``)."""

import json

import pytest
import torch

from model.config import GPTConfig
from model.gpt import GPT
from run_testkit import ALL_OPTIONS, MLA_OPTIONS

SHAPE = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
MLA = dict(attention="mla", n_kv_head=4, kv_latent_dim=16)


@pytest.mark.parametrize("options", [ALL_OPTIONS, MLA_OPTIONS | MLA, dict(tie_embeddings=False, n_kv_head=1),
                                     ALL_OPTIONS | dict(positions="rope"), MLA_OPTIONS | MLA | dict(positions="rope"),
                                     dict(positions="none")],
                         ids=["gqa", "mla", "untied-mqa", "gqa-rope", "mla-rope", "none"])
def test_parameter_count_from_the_config_matches_the_model(options):
    config = GPTConfig(**SHAPE | options)
    model = GPT(config)
    assert config.num_params() == model.num_params()
    assert hasattr(model, "pos_emb") == (config.positions == "learned")  # rope and none have no table


def test_a_config_saved_before_the_options_loads_with_every_option_off():
    config = GPTConfig.from_dict(json.loads(json.dumps(SHAPE)))  # a model_config.json without the keys
    assert (config.value_embeddings, config.tie_embeddings, config.positions) == (False, True, "learned")
    assert (config.attention, config.kv_latent_dim, config.q_latent_dim, config.rope_theta) == ("gqa", None, None, 1e4)
    assert GPTConfig.from_dict(config.to_dict()) == config
    with_options = GPTConfig(**SHAPE | ALL_OPTIONS)
    assert GPTConfig.from_dict(json.loads(json.dumps(with_options.to_dict()))) == with_options


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
