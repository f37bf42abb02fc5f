"""GPTConfig: derived sizes, the loader's messages that name the field, plain checks, dict round trip."""

from __future__ import annotations

import dataclasses
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


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("vocab_size", 0, "at least 1"),
        ("block_size", -3, "at least 1"),
        ("n_layer", 2.5, "whole number"),
        ("n_head", True, "whole number"),
        ("n_kv_head", "2", "whole number"),
        ("n_embd", 0, "at least 1"),
        ("ffn_hidden", 0, "at least 1"),
        ("dropout", 1.0, "0.0 to disable"),
        ("norm_eps", 0.0, "default is 1e-5"),
        ("tie_embeddings", "yes", "true or false"),
        ("positions", "rotary", "use learned (the default), rope"),
        ("positions", "rope", "(n_embd / n_head = 7) must be even"),  # an odd head has no pairs to rotate
        ("rope_theta", 0.0, "the default is 10000"),
    ],
)
def test_bad_field_names_field_and_fix(field, value, fix):
    with pytest.raises(ConfigError) as info:
        GPTConfig.from_dict({**VALID, field: value})
    message = str(info.value)
    assert field in message and fix in message and "\n" not in message
    # The dataclass itself refuses the same value, in a programmer's few words.
    with pytest.raises(ValueError):
        GPTConfig(**{**VALID, field: value})


def test_n_embd_must_divide_by_n_head():
    with pytest.raises(ConfigError, match=r"^model: n_embd \(40\) must be divisible by n_head \(6\)"):
        GPTConfig.from_dict({**VALID, "n_embd": 40})
    with pytest.raises(ValueError, match="invalid GPTConfig: heads must divide evenly"):
        GPTConfig(**{**VALID, "n_embd": 40})


def test_n_head_must_divide_by_n_kv_head():
    with pytest.raises(ConfigError, match=r"n_head \(6\) must be divisible by n_kv_head \(4\).*divisor"):
        GPTConfig.from_dict({**VALID, "n_kv_head": 4})
    with pytest.raises(ValueError, match="invalid GPTConfig"):
        GPTConfig(**{**VALID, "n_kv_head": 4})


def test_dict_round_trip_keeps_every_field():
    cfg = GPTConfig(**VALID, ffn_hidden=96, dropout=0.1, norm_eps=1e-6, tie_embeddings=False)
    assert GPTConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("key, off, on", [
    ("bigram_buckets", None, 8192), ("mtp_weight", 0.0, 0.3), ("mtp_weight", 0, 1), ("mlp", "swiglu", "relu2"),
    ("qk_norm", False, True), ("logit_softcap", None, 15.0), ("residual_scalars", False, True),
    ("zero_init", False, True)])
def test_a_removed_option_loads_when_off_and_is_refused_in_one_line_otherwise(key, off, on):
    # A run's model_config.json (or its trainer state) written before the option left holds it, off.
    assert GPTConfig.from_dict({**VALID, key: off}) == GPTConfig(**VALID)
    with pytest.raises(ConfigError) as info:
        GPTConfig.from_dict({**VALID, key: on})
    message = str(info.value)
    assert message.startswith(f"model.{key} was removed") and "docs/records.md" in message and "\n" not in message


def test_from_dict_rejects_unknown_and_missing_keys():
    with pytest.raises(ValueError, match=r"unknown config key 'model.n_embed'; did you mean 'model.n_embd'"):
        GPTConfig.from_dict({**VALID, "n_embed": 42})
    partial = dict(VALID)
    del partial["n_layer"]
    with pytest.raises(ValueError, match=r"missing required config key 'model.n_layer'"):
        GPTConfig.from_dict(partial)
    with pytest.raises(ValueError, match="must be a mapping"):
        GPTConfig.from_dict([1, 2])


# The extremes each float key of GPTConfig accepts (model.config_checks): past each, the arithmetic
# leaves fp32 or the model cannot learn.
EDGES = {"rope_theta": (1.0 + 1e-6, 1e12), "norm_eps": (1e-12, 1e-2), "dropout": (0.0, 0.99)}
ROPE_SHAPE = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, positions="rope")


def test_every_float_key_has_its_bounds():
    hints = typing.get_type_hints(GPTConfig)
    floats = {f.name for f in dataclasses.fields(GPTConfig)
              if float in (hints[f.name], *typing.get_args(hints[f.name]))}
    assert floats == set(EDGES)


@pytest.mark.parametrize("field, value, words", [
    ("rope_theta", 1e-50, "rope_theta must be above 1 and at most 1e+12, got 1e-50"),
    ("rope_theta", 1.0, "above 1"),
    ("rope_theta", 1e13, "at most 1e+12"),
    ("rope_theta", math.nan, "got nan"),
    ("norm_eps", 1e-50, "norm_eps must be between 1e-12 and 0.01, got 1e-50"),
    ("norm_eps", 1.0, "between 1e-12 and 0.01"),
    ("dropout", math.nan, "dropout must be in [0, 1)"),
])
def test_finite_but_absurd_values_are_refused_when_the_config_is_read(field, value, words):
    with pytest.raises(ConfigError) as info:
        GPTConfig.from_dict({**ROPE_SHAPE, field: value})
    assert str(info.value).startswith(f"model: {field} ") and words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("field", list(EDGES))
def test_the_extremes_each_float_key_accepts_still_train(field):
    """The bounds refuse only what cannot work: at either end of each, a training step has a finite
    loss and finite gradients that are not all zero."""
    for value in EDGES[field]:
        torch.manual_seed(0)
        model = GPT(GPTConfig.from_dict({**ROPE_SHAPE, field: value})).train()
        idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
        _, loss = model(idx, idx)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        assert torch.isfinite(loss) and torch.isfinite(grads).all() and grads.abs().max() > 1e-6, (field, value)


@pytest.mark.parametrize("field, value", [("rope_theta", 1e-50), ("norm_eps", 1e30)])
def test_past_the_bounds_a_training_step_is_nan_or_learns_nothing(field, value):
    """The case where the answer is yes: the values refused do break training (the dataclass,
    which only guards against programmer errors, still builds them)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**ROPE_SHAPE, field: value})).train()
    idx = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    _, loss = model(idx, idx)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert not torch.isfinite(loss) or not torch.isfinite(grads).all() or grads.abs().max() < 1e-6
