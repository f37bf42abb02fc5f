"""GPTConfig: derived sizes, the loader's messages that name the field, plain checks, dict round trip."""

from __future__ import annotations

import pytest

from common.config import ConfigError
from model import GPTConfig

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


@pytest.mark.parametrize("key, off, on", [("bigram_buckets", None, 8192), ("mtp_weight", 0.0, 0.3), ("mtp_weight", 0, 1)])
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
