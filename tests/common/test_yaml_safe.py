"""Bounded YAML: file size, duplicate keys and alias expansion capped, each refused in one line."""

import pytest

from common.config import ConfigError, read_yaml
from common.yaml_safe import MAX_EXPANDED_NODES, YamlLimitError, read_yaml_text
from training.config import load_run_config


def _load(text: str):
    return read_yaml(text, source="test.yaml")  # the one YAML reader configs go through


def _alias_bomb(levels: int) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_duplicate_keys_alias_bombs_and_big_files_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=f"more than {MAX_EXPANDED_NODES:,} values"):
        _load(_alias_bomb(9))  # 9**9 strings once expanded
    with pytest.raises(ConfigError, match="recursive"):
        _load("a: &a [1, *a]\n")
    assert len(_load(_alias_bomb(3))["a2"]) == 9  # a modest reuse still works
    # The file size is capped.
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * 2000 + "\n")
    with pytest.raises(YamlLimitError, match="larger than 1,000 bytes"):
        read_yaml_text(big, max_bytes=1000)
    assert read_yaml_text(big, max_bytes=5000).startswith("# x")
    # Duplicate keys are refused at any depth.
    with pytest.raises(ConfigError, match=r"test.yaml line 4: .*duplicate key 'lr' \(first on line 2\)"):
        _load("train:\n  lr: 1\n  batch_size: 2\n  lr: 3\n")
    with pytest.raises(ConfigError, match="duplicate key 'train'"):
        _load("train: {}\ntrain: {}\n")
    # The same text under different parents, and merge keys overridden on purpose, are fine.
    assert _load("a: {x: 1}\nb: {x: 2}\n") == {"a": {"x": 1}, "b": {"x": 2}}
    assert _load("base: &b {x: 1, y: 2}\nd:\n  <<: *b\n  x: 3\n")["d"] == {"x": 3, "y": 2}


@pytest.mark.parametrize("make, expected", [
    (lambda tmp: "/dev/zero", "larger than"),
    (lambda tmp: _write(tmp, "model:\n  n_layer: 2\nmodel:\n  n_layer: 3\n"), "duplicate key 'model'"),
    (lambda tmp: _write(tmp, _alias_bomb(9)), "write the values out"),
])
def test_config_loader_reports_each_in_one_line(tmp_path, make, expected):
    with pytest.raises(ConfigError, match=expected) as info:
        load_run_config(make(tmp_path))
    assert "\n" not in str(info.value)


def _write(tmp_path, text: str):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path
