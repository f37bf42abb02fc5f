"""The quoting corpus (data.source: quotes): passages of the plays written twice, split by play as
pretraining splits the plays, the same for the same seed."""

from data.config import DataConfig, QuotesSourceConfig
from data.sources.corpus import load_source, source_spec
from data.sources.quotes import quote_documents
from data.sources.shakespeare import held_out_plays, play_files, play_id, shakespeare_documents

SMALL = QuotesSourceConfig(seed=3, passages=400, min_chars=40, max_chars=120)


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
    assert held_out and held_out < {play_id(path) for path in play_files()}
    docs = load_source(cfg, progress=False)
    train_plays, val_plays = ({doc_id.split("/")[0] for doc_id in ids} for ids in (docs.train_ids, docs.val_ids))
    assert val_plays == held_out and not train_plays & held_out
    assert len(docs.train) + len(docs.val) == 400 and len(docs.val) == len(docs.val_ids) > 0
    # Another split holds other plays out, and so validates on other passages.
    assert held_out_plays(cfg.val_fraction, cfg.split_seed + 1) != held_out


def test_the_corpus_follows_from_its_seed_alone():
    assert quote_documents(SMALL) == quote_documents(QuotesSourceConfig(**vars(SMALL)))
    other = QuotesSourceConfig(**{**vars(SMALL), "seed": 4})
    assert quote_documents(other) != quote_documents(SMALL)
    spec = source_spec(DataConfig(source="quotes", quotes=SMALL))
    assert spec == source_spec(DataConfig(source="quotes", quotes=QuotesSourceConfig(**vars(SMALL))))
    assert spec != source_spec(DataConfig(source="quotes", quotes=other))
