"""The byte-level tokenizer: exact round trips on hostile text, byte accounting, and a missing or damaged
tokenizer refused in one line (a run's damaged one asks for the run's own file back rather than new data)."""

import json
import random

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers

import data.tokenizer as tk
from common.errors import DataError
from data.tokenizer import byte_to_unicode, encode_documents, load_tokenizer, split_for_encoding, token_byte_lengths
from model.config import GPTConfig
from model.gpt import GPT
from model.io import save_pretrained
from rundir.loading import load_run

HOSTILE = [
    "",
    " ",
    "   leading spaces",
    "trailing spaces   ",
    "multiple     spaces  inside",
    "\n\nnewlines\n\n\n",
    "\ttabs\t\tand\r\nCRLF\r",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "CJK 東京都 中文 한국어 日本語",
    "combining e\u0301 a\u0308 n\u0303 \u0301 alone",
    "zero width \u200b\u200d joiner, bidi \u202e reversed",
    "control \x00\x01\x7f chars and \ufeff BOM",
    "astral 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈",
    "unpaired-looking surrogates are not str, but \U0010ffff is",
    "mixed: Ωmega ß ẞ ﬁ ﬀ Ǆ İ ı",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_round_trip_on_hostile_unicode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


def test_round_trip_on_random_code_points(tokenizer):
    rng = random.Random(0)
    for _ in range(50):
        ranges = [(0x20, 0x7F), (0xA0, 0xD7FF), (0x10000, 0x10FFFF), (0x20, 0x21), (0x0A, 0x0B)]
        text = "".join(chr(rng.randrange(*rng.choice(ranges))) for _ in range(rng.randrange(1, 60)))
        assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_byte_alphabet_matches_the_pre_tokenizer():
    mapping = byte_to_unicode()
    assert sorted(mapping) == list(range(256)) and set(mapping.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert mapping[ord("A")] == "A" and mapping[ord(" ")] == "Ġ" and mapping[ord("\n")] == "Ċ"
    assert np.array_equal(np.frombuffer(tk.token_bytes("ĠĊ"), np.uint8), [32, 10])  # and back to bytes


def test_token_byte_lengths_sum_to_the_utf8_length(tokenizer):
    lengths = token_byte_lengths(tokenizer)
    assert lengths.shape == (tokenizer.get_vocab_size(),)
    n_special = len(tk.SPECIAL_TOKENS)
    assert (lengths[:n_special] == 0).all()  # EOT and the chat tokens stand for no text
    assert (lengths[n_special:n_special + 256] == 1).all()  # then the 256 single-byte symbols
    for text in HOSTILE:
        ids = tokenizer.encode(text).ids
        assert lengths[ids].sum() == len(text.encode("utf-8"))
    # Per token, too: each id's byte count is what it decodes to as raw bytes.
    for token_id in range(n_special + 256, tokenizer.get_vocab_size(), 17):
        raw = tk.token_bytes(tokenizer.id_to_token(token_id))
        assert lengths[token_id] == len(raw) >= 2


def test_eot_inside_text_stays_text_when_encoding_documents(tokenizer):
    tokenizer = Tokenizer.from_str(tokenizer.to_str())
    tokenizer.encode_special_tokens = True
    ids = encode_documents(tokenizer, ["a <|endoftext|> b", "c"], eot=0)
    assert ids.count(0) == 2 and ids[0] == 0 and tokenizer.decode(ids[1 : ids.index(0, 1)]) == "a <|endoftext|> b"


def test_split_for_encoding_never_changes_the_tokens(tokenizer, monkeypatch):
    monkeypatch.setattr(tk, "_PIECE_CHARS", 8)
    rng = random.Random(1)
    alphabet = ["a", "Z", "é", "😀", " ", "  ", "\n", "\n\n", "\t", "'s", "'ll", "9", "!", "\r\n", "東",
                "\x1c", "\x85", "\u180e", "\u200b", "\u00a0", "\u3000", "\u2028", "\x0b"]
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80)))
        pieces = split_for_encoding(text)
        assert "".join(pieces) == text
        whole = tokenizer.encode(text).ids
        assert [i for p in pieces for i in tokenizer.encode(p).ids] == whole
    assert len(split_for_encoding("line one\nline two\nline three\n" * 5)) > 1


def test_saved_file_loads_with_tokenizers_and_transformers_and_has_no_normalizer(tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(tokenizer.to_str(), encoding="utf-8")
    loaded = load_tokenizer(path)
    assert loaded.encode("To be, or not").ids == tokenizer.encode("To be, or not").ids
    spec = json.loads(path.read_text(encoding="utf-8"))
    assert spec["normalizer"] is None and spec["decoder"]["type"] == "ByteLevel"
    assert spec["pre_tokenizer"]["type"] == "ByteLevel" and spec["pre_tokenizer"]["add_prefix_space"] is False
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
    for text in HOSTILE:
        assert fast.decode(fast.encode(text)) == text


@pytest.mark.parametrize("read, fragment", [
    (lambda tmp: load_tokenizer(tmp / "missing.json"), "does not exist"),
    (lambda tmp: (tmp / "bad.json").write_text("{not json") and load_tokenizer(tmp / "bad.json"),
     "not a valid tokenizer.json"),
    (lambda tmp: tk.token_bytes("\u4e00"), "not byte-level"),
])
def test_a_missing_or_damaged_tokenizer_or_a_token_of_no_bytes_is_refused(tmp_path, read, fragment):
    with pytest.raises(DataError, match=fragment):
        read(tmp_path)


def test_a_damaged_run_tokenizer_asks_for_the_runs_own_file(tokenizer, tmp_path):
    torch.manual_seed(0)
    save_pretrained(GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=16, n_layer=1, n_head=2,
                                  n_kv_head=1, n_embd=16)), tmp_path / "run")
    (tmp_path / "run" / "tokenizer.json").write_text('{"not": "a tokenizer"')
    with pytest.raises(DataError) as info:
        load_run(tmp_path / "run", "cpu")
    assert "restore the run's own tokenizer.json" in str(info.value) and "prepare the data again" not in str(info.value)
