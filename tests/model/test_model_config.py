"""GPTConfig: derived sizes, the refusals that name the key, the bounds, dict round trip."""

import json
import math
import typing

import pytest
import torch

from common.config import ConfigError
from model.config import GPTConfig
from model.gpt import GPT

VALID = dict(vocab_size=97, block_size=37, n_layer=2, n_head=6, n_kv_head=2, n_embd=42)


def test_derived_sizes():
    cfg = GPTConfig(**VALID)
    assert cfg.head_dim == 7
    # 8/3 * 42 = 112 -> next multiple of 64.
    assert cfg.ffn_dim == 128
    assert GPTConfig(**{**VALID, "n_embd": 384}).ffn_dim == 1024  # 8/3 * 384 = 1024 exactly
    assert GPTConfig(**{**VALID, "n_embd": 512, "n_head": 8}).ffn_dim == 1408  # 1365 -> 1408
    assert GPTConfig(**VALID, ffn_hidden=100).ffn_dim == 100


# Options that lost by the records, with the value that turned each off and one that did not.
REMOVED = [("bigram_buckets", None, 8192), ("mtp_weight", 0.0, 0.3), ("mtp_weight", 0, 1), ("mlp", "swiglu", "relu2"),
           ("qk_norm", False, True), ("logit_softcap", None, 15.0), ("residual_scalars", False, True),
           ("zero_init", False, True)]


MLA = {"attention": "mla", "n_kv_head": 6}
# The model section's refusals: keys over VALID, and the part of the one-line message they must give.
MODEL_REFUSALS = [
    ({"n_embed": 42}, "unknown config key 'model.n_embed'; did you mean 'model.n_embd'?"),
    ({"vocab_size": 0}, "model.vocab_size must be greater than or equal to 1, got 0"),
    ({"block_size": -3}, "model.block_size must be greater than or equal to 1, got -3"),
    ({"n_layer": 2.5}, "model.n_layer must be a valid integer, got 2.5"),
    ({"n_head": True}, "model.n_head must be a valid integer, got true"),
    ({"n_kv_head": "2"}, "model.n_kv_head must be a valid integer, got '2'"),
    ({"n_embd": 0}, "model.n_embd must be greater than or equal to 1, got 0"),
    ({"ffn_hidden": 0}, "model.ffn_hidden must be greater than or equal to 1, got 0"),
    ({"dropout": 1.0}, "model.dropout must be less than 1, got 1.0"),
    ({"dropout": math.nan}, "model.dropout must be less than 1, got nan"),
    ({"norm_eps": 1e-13}, "model.norm_eps must be greater than or equal to 0.000000000001, got 1e-13"),
    ({"norm_eps": 0.011}, "model.norm_eps must be less than or equal to 0.01, got 0.011"),
    ({"tie_embeddings": "yes"}, "model.tie_embeddings must be a valid boolean, got 'yes'"),
    ({"value_embeddings": 1}, "model.value_embeddings must be a valid boolean, got 1"),
    ({"positions": "rotary"}, "model.positions must be 'learned', 'rope' or 'none', got 'rotary'"),
    ({"positions": "rope"}, "model: positions rope rotates pairs of numbers, so the rotated part of each head (7 of "
                            "n_embd / n_head = 7) must be even"),  # an odd head has no pairs to rotate
    ({"rope_theta": 1.0}, "model.rope_theta must be greater than 1, got 1.0"),
    ({"rope_theta": 1e-50}, "model.rope_theta must be greater than 1, got 1e-50"),
    ({"rope_theta": 1.01e12}, "model.rope_theta must be less than or equal to 1000000000000"),
    ({"rope_theta": math.nan}, "model.rope_theta must be less than or equal to 1000000000000, got nan"),
    ({"n_embd": 40}, "model: n_embd (40) must be divisible by n_head (6); pick n_head from the divisors"),
    ({"n_kv_head": 4}, "model: n_head (6) must be divisible by n_kv_head (4); set n_kv_head to a divisor of n_head"),
    ({"attention": "foo"}, "model.attention must be 'gqa' or 'mla', got 'foo'"),
    (MLA, "model: attention mla needs kv_latent_dim, the width of the cached key/value latent"),
    ({**MLA, "kv_latent_dim": 0}, "model.kv_latent_dim must be greater than or equal to 1, got 0"),
    ({**MLA, "kv_latent_dim": 8, "q_latent_dim": -1}, "model.q_latent_dim must be greater than or equal to 1"),
    ({"kv_latent_dim": 8}, "model: kv_latent_dim is set (8) but attention is 'gqa'; remove kv_latent_dim"),
    ({"q_latent_dim": 8}, "model: q_latent_dim is set (8) but attention is 'gqa'; remove q_latent_dim"),
    ({"attention": "mla", "kv_latent_dim": 8}, "so n_kv_head must equal n_head (6), got 2; set n_kv_head: 6"),
    ({**MLA, "kv_latent_dim": 8, "n_embd": 36, "positions": "rope"},
     "model: positions rope rotates pairs of numbers, so the rotated part of each head (3 of n_embd / n_head = 6)"),
    ({**MLA, "kv_latent_dim": 8, "value_embeddings": True}, "model: value_embeddings needs attention gqa"),
    # Options that lost by the records: at any value but the one that turned them off.
    *[({key: on}, f"model.{key} was removed: it lost by the records protocol (docs/records.md")
      for key, _, on in REMOVED],
]


@pytest.mark.parametrize("changes, expected", MODEL_REFUSALS)
def test_model_refusals(changes, expected):
    with pytest.raises(ConfigError) as info:
        GPTConfig.from_dict({**VALID, **changes})
    assert expected in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ValueError):  # built in code, the config refuses the same
        GPTConfig(**{**VALID, **changes})


@pytest.mark.parametrize("key, off, on", REMOVED)
def test_a_removed_option_at_its_off_value_loads(key, off, on):
    # A run's model_config.json (or its trainer state) written before the option left holds it, off.
    assert GPTConfig.from_dict({**VALID, key: off}) == GPTConfig(**VALID)


def test_from_dict_round_trips_turns_absent_options_off_and_rejects_missing_keys_and_what_is_no_section():
    cfg = GPTConfig(**VALID, ffn_hidden=96, dropout=0.1, norm_eps=1e-6, tie_embeddings=False, value_embeddings=True)
    assert GPTConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    config = GPTConfig.from_dict(json.loads(json.dumps(VALID)))  # a model_config.json saved before the options
    assert (config.value_embeddings, config.tie_embeddings, config.positions) == (False, True, "learned")
    assert (config.attention, config.kv_latent_dim, config.q_latent_dim, config.rope_theta) == ("gqa", None, None, 1e4)
    partial = dict(VALID)
    del partial["n_layer"]
    with pytest.raises(ValueError, match=r"missing required config key 'model.n_layer'"):
        GPTConfig.from_dict(partial)
    with pytest.raises(ValueError, match="model must be a valid dictionary"):
        GPTConfig.from_dict([1, 2])


# The extremes each float key of GPTConfig accepts: past each, the arithmetic leaves fp32 or the
# model cannot learn.
EDGES = {"rope_theta": (1.0 + 1e-6, 1e12), "norm_eps": (1e-12, 1e-2), "dropout": (0.0, 0.99)}
ROPE_SHAPE = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, positions="rope")


def test_every_float_key_has_its_bounds():
    floats = {name for name, field in GPTConfig.model_fields.items()
              if float in (field.annotation, *typing.get_args(field.annotation))}
    assert floats == set(EDGES)


def _trains(config: GPTConfig) -> bool:
    """A training step has a finite loss and finite gradients that are not all zero."""
    torch.manual_seed(0)
    model = GPT(config).train()
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    _, loss = model(idx, idx)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return bool(torch.isfinite(loss) and torch.isfinite(grads).all() and grads.abs().max() > 1e-6)


# The bounds refuse only what cannot work: at either end of each key a step trains, and the values
# refused do break training (built unchecked).
@pytest.mark.parametrize("field, value, trains", [(field, value, True) for field in EDGES for value in EDGES[field]]
                         + [("rope_theta", 1e-50, False), ("norm_eps", 1e30, False)])
def test_the_extremes_each_float_key_accepts_still_train_and_past_them_do_not(field, value, trains):
    raw = {**ROPE_SHAPE, field: value}
    assert _trains(GPTConfig.from_dict(raw) if trains else GPTConfig.model_construct(**raw)) == trains
