"""The layer map names every linear layer of a block with its real shape, and its parts cover the rows."""

import pytest
from torch import nn

from model.config import GPTConfig
from model.gpt import GPT
from model.layer_map import block_linears

SHAPE = dict(vocab_size=64, block_size=16, n_layer=1, n_head=4, n_kv_head=2, n_embd=32)


@pytest.mark.parametrize("options", [
    {}, {"positions": "rope"}, {"ffn_hidden": 40},
    {"attention": "mla", "n_kv_head": 4, "kv_latent_dim": 24},
    {"attention": "mla", "n_kv_head": 4, "kv_latent_dim": 24, "q_latent_dim": 12, "positions": "rope"},
], ids=["gqa", "rope", "ffn", "mla", "mla-q-latent-rope"])
def test_every_linear_of_a_block_is_mapped_with_its_shape(options):
    config = GPTConfig(**{**SHAPE, **options})
    block = GPT(config).blocks[0]
    linears = {name: (m.in_features, m.out_features) for name, m in block.named_modules()
               if isinstance(m, nn.Linear) and not name.endswith("value_gate")}
    mapped = block_linears(config)
    assert {name: (layer.in_features, layer.out_features) for name, layer in mapped.items()} == linears
    for layer in mapped.values():
        assert all(part.rows >= 1 for part in layer.parts)
        assert len({part.name for part in layer.parts}) == len(layer.parts)
