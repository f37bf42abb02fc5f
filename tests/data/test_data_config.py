from __future__ import annotations

import pytest

from data.config import DataConfig, FilesSourceConfig, HubSourceConfig, MIN_VOCAB_SIZE
from data.errors import DataError


def test_defaults_are_the_shakespeare_corpus():
    cfg = DataConfig()
    assert cfg.source == "shakespeare"
    assert cfg.vocab_size == 2048
    assert cfg.hub.val_split == "validation"
    assert cfg.files.encoding_errors == "strict"


def test_from_dict_round_trips_and_builds_sections():
    cfg = DataConfig.from_dict(
        {"source": "hub", "hub": {"name": "roneneldan/TinyStories", "max_documents": 10}}
    )
    assert isinstance(cfg.hub, HubSourceConfig)
    assert cfg.hub.max_documents == 10
    assert DataConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"source": "wikipedia"}, ["data.source", "shakespeare, hub, files"]),
        ({"vocab_size": 100}, ["data.vocab_size", "263"]),
        ({"vocab_size": True}, ["data.vocab_size"]),
        ({"val_fraction": 1.0}, ["data.val_fraction"]),
        ({"val_fraction": 0}, ["data.val_fraction"]),
        ({"source": "hub"}, ["data.hub.name"]),
        ({"source": "files"}, ["data.files.paths"]),
        ({"cache_dir": ""}, ["data.cache_dir"]),
    ],
)
def test_bad_values_name_the_key(kwargs, words):
    with pytest.raises(DataError) as err:
        DataConfig(**kwargs)
    for word in words:
        assert word in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_section_values():
    with pytest.raises(DataError, match="max_documents"):
        HubSourceConfig(name="x", max_documents=0)
    with pytest.raises(DataError, match="streaming"):
        HubSourceConfig(name="x", streaming=True)
    with pytest.raises(DataError, match="encoding_errors"):
        FilesSourceConfig(paths=["a.txt"], encoding_errors="ignore")
    with pytest.raises(DataError, match="list"):
        FilesSourceConfig(paths="a.txt")  # type: ignore[arg-type]


def test_unknown_keys_are_rejected_with_the_valid_ones():
    with pytest.raises(DataError, match="data.vocab"):
        DataConfig.from_dict({"vocab": 10})
    with pytest.raises(DataError, match="data.hub.nam.*name"):
        DataConfig.from_dict({"hub": {"nam": "x"}})


def test_the_least_vocabulary_admitted_is_the_least_the_tokenizer_trainer_makes():
    # 257 was admitted, then always refused: the trained tokenizer had the chat tokens as well.
    from data.tokenizer import train_tokenizer

    with pytest.raises(DataError, match=rf"^data.vocab_size must be from {MIN_VOCAB_SIZE} "):
        DataConfig(vocab_size=MIN_VOCAB_SIZE - 1)
    least = DataConfig(vocab_size=MIN_VOCAB_SIZE).vocab_size
    assert train_tokenizer(["a b c, and the rest of it"] * 20, least).get_vocab_size() == least
