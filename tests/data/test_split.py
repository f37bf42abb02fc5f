import pytest

from common.errors import DataError
from data.sources.documents import hash_split, validation_score
from data.sources.shakespeare import play_files, play_id


def test_split_is_deterministic_disjoint_and_complete():
    ids = [f"doc-{i}" for i in range(1000)]
    train, val = hash_split(ids, 0.1, seed=7)
    assert (train, val) == hash_split(list(ids), 0.1, seed=7)
    assert set(train).isdisjoint(val) and sorted(train + val) == list(range(len(ids)))
    assert 60 <= len(val) <= 140  # ~Binomial(1000, 0.1)


def test_side_depends_only_on_seed_and_id():
    ids = [f"doc-{i}" for i in range(200)]
    _, val = hash_split(ids, 0.2, seed=3)
    held_out = {ids[i] for i in val}
    shuffled = ids[::-1] + ["a-new-document"]
    _, val2 = hash_split(shuffled, 0.2, seed=3)
    assert held_out == {shuffled[i] for i in val2} - {"a-new-document"}
    _, other = hash_split(ids, 0.2, seed=4)
    assert {ids[i] for i in other} != held_out and 0.0 <= validation_score("x", 1) < 1.0


def test_tiny_corpora_still_get_one_document_on_each_side():
    for seed in range(20):
        train, val = hash_split(["a", "b"], 0.01, seed=seed)
        assert len(train) == len(val) == 1
        train, val = hash_split(["a", "b", "c"], 0.99, seed=seed)
        assert len(train) == 1 and len(val) == 2
    with pytest.raises(DataError, match="at least 2"):  # fewer than two documents
        hash_split(["only"], 0.1, seed=0)


def test_default_shakespeare_holdout_is_a_few_whole_plays():
    ids = [play_id(p) for p in play_files()]
    train, val = hash_split(ids, 0.1, seed=1234)
    assert 1 <= len(val) <= 8 and len(train) + len(val) == len(ids)
