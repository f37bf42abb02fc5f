"""The induction lab's corpus (data.source: synthetic): each document a sequence of distinct words
written twice, the same for the same seed, every word one token once the tokenizer is trained."""

from data.config import DataConfig, SyntheticSourceConfig
from data.prepared.text import prepare_data
from data.sources.corpus import load_source, source_spec
from data.sources.synthetic import repeat_documents, word_list

SMALL = SyntheticSourceConfig(seed=3, documents=300, words=64, min_words=5, max_words=12)


def test_each_document_is_a_sequence_of_distinct_words_written_twice():
    documents = repeat_documents(SMALL)
    words = set(word_list(64, 3))
    assert len(documents) == 300 and len(words) == 64
    lengths = set()
    for text in documents:
        assert text.startswith(" ")  # the first word is the same token as every other
        sequence = text.split()
        half = len(sequence) // 2
        assert sequence[:half] == sequence[half:] and len(set(sequence[:half])) == half and set(sequence) <= words
        lengths.add(half)
    assert lengths == set(range(5, 13))  # every length of 5-12 occurs in 300 draws


def test_the_corpus_follows_from_its_seed_alone():
    assert repeat_documents(SMALL) == repeat_documents(SyntheticSourceConfig(**vars(SMALL)))
    other = SyntheticSourceConfig(**{**vars(SMALL), "seed": 4})
    assert repeat_documents(other) != repeat_documents(SMALL) and word_list(64, 4) != word_list(64, 3)
    cfg = DataConfig(source="synthetic", synthetic=SMALL)
    assert source_spec(cfg) == source_spec(DataConfig(source="synthetic", synthetic=SMALL))
    assert source_spec(cfg) != source_spec(DataConfig(source="synthetic", synthetic=other))
    docs = load_source(cfg, progress=False)
    assert docs.train["text"] == repeat_documents(SMALL) and len(set(docs.train_ids)) == 300


def test_every_word_is_one_token_of_the_trained_tokenizer(tmp_path):
    # configs/induction.yaml's vocabulary and word list, on fewer documents.
    cfg = DataConfig(source="synthetic", vocab_size=1024, cache_dir=str(tmp_path),
                     synthetic=SyntheticSourceConfig(seed=0, documents=2000, words=256))
    tokenizer = prepare_data(cfg, progress=False).tokenizer()
    pieces = [len(tokenizer.encode(" " + word, add_special_tokens=False).ids) for word in word_list(256, 0)]
    assert pieces == [1] * 256
