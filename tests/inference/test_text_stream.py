"""The streaming decoder: whole characters only, the tokenizer's decode, and stop strings."""

import random

import pytest
from tokenizers import Tokenizer

from data.tokenizer import token_byte_table
from inference.streaming import TextStream


@pytest.fixture(scope="module")
def tokenizer(tokenizer_path) -> Tokenizer:
    return Tokenizer.from_file(str(tokenizer_path))


@pytest.fixture(scope="module")
def table(tokenizer) -> list[bytes]:
    return token_byte_table(tokenizer)


def stream_pieces(table, ids, stop=()) -> tuple[list[str], TextStream]:
    stream = TextStream(table, stop)
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.finish())
    return pieces, stream


def test_split_emoji_is_printed_only_when_complete(tokenizer, table):
    text = "smile 😀🎉 世界 naïve 👍🏽!"
    ids = tokenizer.encode(text).ids
    # The case under test really happens: some tokens are fragments of a character.
    assert any(not _is_utf8(table[i]) for i in ids)
    pieces, stream = stream_pieces(table, ids)
    assert "".join(pieces) == stream.text == text == tokenizer.decode(ids)
    assert not any("\ufffd" in piece for piece in pieces)
    # Fragments yield nothing until the token that completes their character.
    assert "" in pieces[:-1]

def test_random_token_sequences_join_to_the_tokenizers_decode_and_special_tokens_show(tokenizer, table):
    # Random ids give every kind of byte soup: truncated characters, stray continuation bytes,
    # special tokens in the middle. The stream must agree with decode on all of it.
    rng = random.Random(0)
    vocab = tokenizer.get_vocab_size()
    for _ in range(400):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        pieces, stream = stream_pieces(table, ids)
        assert "".join(pieces) == stream.text == tokenizer.decode(ids, skip_special_tokens=False), ids
    # Special tokens stay visible and unknown ids decode to nothing.
    eot = tokenizer.token_to_id("<|endoftext|>")
    ids = tokenizer.encode("a b").ids
    pieces, stream = stream_pieces(table, [*ids, eot, len(table) + 5, *ids])
    assert stream.text == "a b<|endoftext|>a b"


@pytest.mark.parametrize("text, stops, expected", [
    ("Hello there. ROMEO: hi", ["ROMEO:"], "Hello there. "),
    ("abcabd and more", ["abd"], "abc"),  # a false start ("ab" then "c") is released
    ("one\n\ntwo\nthree", ["\n\n", "two"], "one"),  # the earliest stop wins
    ("xx two\n\n", ["\n\n", "two"], "xx "),
    ("no stop here at all", ["zzz"], "no stop here at all"),  # held "" released at the end
    ("ends with a partial stop STO", ["STOP"], "ends with a partial stop STO"),
    ("😀🎉 then 🎉", ["🎉"], "😀"),  # a stop string made of split bytes
])
def test_stop_strings_cut_the_text_before_the_first_occurrence(tokenizer, table, text, stops, expected):
    ids = tokenizer.encode(text).ids
    pieces, stream = stream_pieces(table, ids, stops)
    assert "".join(pieces) == stream.text == expected
    assert stream.stopped == (expected != text)
    # Nothing is handed out that could still turn out to be part of a stop string.
    seen = ""
    for piece in pieces:
        seen += piece
        assert not any(stop in seen for stop in stops)
    assert not stream.stopped or stream.push(tokenizer.encode("a").ids[0]) == ""  # nothing after a stop


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
