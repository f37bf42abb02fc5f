import pytest

from common.errors import DataError
from data.config import MIN_VOCAB_SIZE, DataConfig, HubSourceConfig, QuotesSourceConfig, SyntheticSourceConfig
from data.tokenizer import train_tokenizer


def test_defaults_are_the_shakespeare_corpus_and_from_dict_round_trips():
    cfg = DataConfig()
    assert (cfg.source, cfg.vocab_size, cfg.hub.val_split, cfg.files.encoding_errors) == (
        "shakespeare", 2048, "validation", "strict")
    cfg = DataConfig.from_dict({"source": "hub", "hub": {"name": "roneneldan/TinyStories", "max_documents": 10}})
    assert isinstance(cfg.hub, HubSourceConfig) and cfg.hub.max_documents == 10
    assert DataConfig.from_dict(cfg.to_dict()) == cfg


# The data section's refusals: a section as written, and the part of the one-line message it must give.
DATA_REFUSALS = [
    ({"vocab": 10}, "unknown config key 'data.vocab'; did you mean 'data.vocab_size'?"),
    ({"hub": {"nam": "x"}}, "unknown config key 'data.hub.nam'; did you mean 'data.hub.name'?"),
    ({"source": "wikipedia"}, "data.source must be 'shakespeare', 'hub', 'files', 'synthetic', 'quotes' or "
                              "'calculator', got 'wikipedia'"),
    ({"format": "dialogue"}, "data.format must be 'text', 'chat', 'preference' or 'rl', got 'dialogue'"),
    ({"vocab_size": MIN_VOCAB_SIZE - 1}, f"data.vocab_size must be greater than or equal to {MIN_VOCAB_SIZE}, got"),
    ({"vocab_size": 2**32}, "data.vocab_size must be less than or equal to 4294967295, got 4294967296"),
    ({"vocab_size": True}, "data.vocab_size must be a valid integer, got true"),
    ({"val_fraction": 1.0}, "data.val_fraction must be less than 1, got 1.0"),
    ({"val_fraction": 0}, "data.val_fraction must be greater than 0, got 0"),
    ({"cache_dir": ""}, "data.cache_dir must have at least 1 character"),
    ({"tokenize_batch_size": 0}, "data.tokenize_batch_size must be greater than or equal to 1, got 0"),
    ({"source": "hub"}, "data.source is 'hub' but data.hub.name is empty"),
    ({"source": "files"}, "data.source is 'files' but data.files.paths is empty"),
    ({"format": "chat", "source": "synthetic"}, "data.source synthetic makes text, not conversations"),
    ({"source": "calculator"}, "data.source calculator makes conversations that call the calculator: use it with "
                               "data.format: chat"),
    ({"source": "calculator", "format": "preference"}, "data.source calculator makes conversations"),
    ({"format": "preference"}, "data.format: preference reads reply pairs from data.source files or hub"),
    ({"hub": {"name": "x", "max_documents": 0}}, "data.hub.max_documents must be greater than or equal to 1, got 0"),
    ({"hub": {"name": "x", "max_bytes": 0}}, "data.hub.max_bytes must be greater than or equal to 1, got 0"),
    ({"hub": {"name": "x", "streaming": True}}, "data.hub.streaming reads a slice of a large corpus"),
    ({"files": {"paths": "a.txt"}}, "data.files.paths must be a valid list, got 'a.txt'"),
    ({"files": {"encoding_errors": "ignore"}}, "data.files.encoding_errors must be 'strict' or 'replace', got 'ignore'"),
    ({"files": {"format": "csv"}}, "data.files.format must be 'auto', 'txt', 'jsonl' or 'parquet', got 'csv'"),
    ({"files": {"txt_document": "page"}}, "data.files.txt_document must be 'file', 'paragraph' or 'line'"),
    ({"synthetic": {"documents": 0}}, "data.synthetic.documents must be greater than or equal to 1, got 0"),
    ({"synthetic": {"words": 1}}, "data.synthetic.words must be greater than or equal to 2, got 1"),
    ({"synthetic": {"words": 10_001}}, "data.synthetic.words must be less than or equal to 10000"),
    ({"synthetic": {"min_words": 0}}, "data.synthetic needs 1 <= min_words <= max_words <= words"),
    ({"synthetic": {"min_words": 9, "max_words": 8}}, "got min_words 9, max_words 8, words 256"),
    ({"synthetic": {"words": 20, "max_words": 40}}, "got min_words 8, max_words 40, words 20"),
    # grew memory until killed, with no output; then a MemoryError after minutes
    ({"synthetic": {"documents": 10**12}}, "data.synthetic asks for up to 80,000,000,000,000 words (2 x documents "
                                           "x max_words), more than the 50,000,000 it makes in memory; lower "
                                           "data.synthetic.documents or max_words"),
    ({"synthetic": {"documents": 625_001, "max_words": 40}}, "asks for up to 50,000,080 words"),
    ({"quotes": {"passages": 0}}, "data.quotes.passages must be greater than or equal to 1, got 0"),
    ({"quotes": {"min_chars": 0}}, "data.quotes.min_chars must be greater than or equal to 1, got 0"),
    ({"quotes": {"min_chars": 90, "max_chars": 80}}, "data.quotes needs min_chars <= max_chars"),
    ({"quotes": {"max_chars": 100_001}}, "data.quotes.max_chars must be less than or equal to 100000"),
    ({"quotes": {"passages": 500_001, "max_chars": 200}}, "data.quotes asks for up to 200,000,400 characters (2 x "
                                                          "passages x max_chars), more than the 200,000,000"),
]


@pytest.mark.parametrize("section, expected", DATA_REFUSALS)
def test_data_refusals(section, expected):
    with pytest.raises(DataError) as err:
        DataConfig.from_dict(section)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_bounds_admit_what_is_at_them():
    assert SyntheticSourceConfig(documents=25_000_000 // 40, max_words=40).documents == 625_000  # 50,000,000 words
    assert QuotesSourceConfig(passages=500_000, max_chars=200).passages == 500_000  # 200,000,000 characters


def test_the_least_vocabulary_admitted_is_the_least_the_tokenizer_trainer_makes():
    # 257 was admitted, then always refused: the trained tokenizer had the chat tokens as well.
    least = DataConfig(vocab_size=MIN_VOCAB_SIZE).vocab_size
    assert train_tokenizer(["a b c, and the rest of it"] * 20, least).get_vocab_size() == least
