"""Byte-level BPE: training, loading, exact encoding of long documents, and bytes per token.

Byte-level means every string maps to UTF-8 bytes, and every byte to one of 256 printable
characters before BPE sees it; with no normalizer, decode(encode(s)) == s for any string."""

import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from common.errors import DataError, one_line

EOT = "<|endoftext|>"  # the document separator
# The chat format's tokens (data/chat.py): its system, user and assistant roles and the end of a turn,
# then the tool role and a call.
CHAT_SPECIAL_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
TOOL_SPECIAL_TOKENS = ("<|tool|>", "<|call|>")
# EOT is id 0; the chat tokens follow, then the tool tokens, so any pretrained run can be chat-tuned,
# with tools, without growing its embedding. Tokenizers from before the tool tokens have ids 0-4
# only: the same ids for the same tokens, so their runs chat as before (and refuse tools).
SPECIAL_TOKENS = [EOT, *CHAT_SPECIAL_TOKENS, *TOOL_SPECIAL_TOKENS]

# Everything that decides which tokenizer a corpus gets, besides the corpus and vocab size. It is
# part of the cache key: change it and every cached entry is rebuilt.
TOKENIZER_RECIPE: dict[str, object] = {
    "model": "bpe",
    "pre_tokenizer": "byte_level",
    "add_prefix_space": False,
    "normalizer": None,
    "special_tokens": SPECIAL_TOKENS,
    "version": 2,
}

# A split point inside a document that cannot change its tokens: a newline between two
# non-whitespace characters. The byte-level pre-tokenizer never lets a piece cross it (letter,
# digit and punctuation runs exclude whitespace; the lone "\n" is its own piece whether followed by
# text or by the end of the string), and BPE merges never cross pieces.
_SAFE_SPLIT = re.compile(r"(?<=\S\n)(?=\S)")
# Pieces shorter than this are not split further: the point is only to avoid huge inputs.
_PIECE_CHARS = 4096


def new_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE tokenizer with our recipe."""
    tokenizer = Tokenizer(models.BPE())
    # No normalizer: it would make the round trip lossy (NFC, lowercasing, stripping).
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_tokenizer(
    texts: Iterable[str] | Iterable[list[str]], vocab_size: int, *, length: int | None = None
) -> Tokenizer:
    """Train byte-level BPE on `texts` (strings or batches of them; `length`: their count, if known),
    with `EOT` as id 0 and the chat and tool tokens after it."""
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        # All 256 byte symbols are always in the vocabulary, so no input is ever unencodable.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer, length=length)
    return tokenizer


# Advice that ends the error for a run's damaged tokenizer: unlike a cache entry's, it cannot be
# rebuilt, since the run's model knows its ids.
RUN_TOKENIZER_ADVICE = "restore the run's own tokenizer.json from a backup (retraining it gives other ids)"


def load_tokenizer(path: str | Path, advice: str = "prepare the data again") -> Tokenizer:
    """Load a tokenizer.json that has `EOT`; ``advice`` ends the error for a damaged file (a run's
    tokenizer gets ``RUN_TOKENIZER_ADVICE``)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"tokenizer file {path} does not exist: point to the tokenizer.json of a run or data cache entry"
        )
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for malformed JSON
        raise DataError(
            f"tokenizer file {path} is not a valid tokenizer.json ({one_line(exc)}); {advice}"
        ) from exc
    if tokenizer.token_to_id(EOT) is None:
        raise DataError(f"tokenizer file {path} has no {EOT} token; {advice}")
    return tokenizer


def eot_id(tokenizer: Tokenizer) -> int:
    token_id = tokenizer.token_to_id(EOT)
    if token_id is None:
        raise DataError(f"tokenizer has no {EOT} token; prepare the data again")
    return token_id


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """The ids of a prompt to continue. An empty prompt is the end-of-text token alone, so the model
    starts a fresh document (an unconditional sample)."""
    return (tokenizer.encode(prompt).ids if prompt else []) or [eot_id(tokenizer)]


def split_for_encoding(text: str) -> list[str]:
    """Cut a long document into pieces whose tokens, concatenated, equal the whole's (`_SAFE_SPLIT`
    says why): one 300 KB input encodes markedly slower and gives encode_batch's threads nothing."""
    pieces: list[str] = []
    start = 0
    while len(text) - start > _PIECE_CHARS:
        match = _SAFE_SPLIT.search(text, start + _PIECE_CHARS)
        if match is None:
            break
        pieces.append(text[start : match.start()])
        start = match.start()
    pieces.append(text[start:])
    return pieces


def encode_documents(tokenizer: Tokenizer, texts: list[str], eot: int) -> list[int]:
    """Token ids of `texts`, each preceded by `eot`, as one flat list. The caller sets
    `tokenizer.encode_special_tokens = True`, so a literal "<|endoftext|>" in a document is text."""
    documents = [split_for_encoding(text) for text in texts]
    pieces = [piece for parts in documents for piece in parts]
    # encode_batch runs on all cores (Rust threads); add_special_tokens=False: no post-processor
    # tokens, our own EOT placement below is the only one.
    encodings = iter(tokenizer.encode_batch(pieces, add_special_tokens=False))
    ids: list[int] = []
    for parts in documents:
        ids.append(eot)
        for _ in parts:
            ids.extend(next(encodings).ids)
    return ids


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """The byte-level alphabet (as in GPT-2): printable Latin-1 bytes stand for themselves, the rest
    are shifted to code points from 256 up, so every token is a printable string."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    shifted = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    return {char: byte for byte, char in byte_to_unicode().items()}


def token_bytes(token: str) -> bytes:
    """The raw bytes a byte-level token string stands for."""
    table = unicode_to_byte()
    try:
        return bytes(table[char] for char in token)
    except KeyError as exc:
        raise DataError(
            f"token {token!r} is not byte-level; this tokenizer was not made by prepare_data"
        ) from exc


def token_byte_table(tokenizer: Tokenizer) -> list[bytes]:
    """The bytes each token id decodes to, indexed by id (special tokens: their text)."""
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        raise DataError("tokenizer.json is not a byte-level BPE tokenizer; use the tokenizer.json that "
                        "train.py saved in the run directory")
    table = [b""] * tokenizer.get_vocab_size(with_added_tokens=True)
    added = tokenizer.get_added_tokens_decoder()
    for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        # Added tokens are matched and decoded as their literal text, not through the byte alphabet.
        table[token_id] = added[token_id].content.encode("utf-8") if token_id in added else token_bytes(token)
    return table


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """UTF-8 bytes each token id stands for (int64, length = vocab size; special tokens 0): summed
    over scored targets, the denominator of bits per byte."""
    added = tokenizer.get_added_tokens_decoder()
    table = token_byte_table(tokenizer)
    return np.array([0 if i in added else len(b) for i, b in enumerate(table)], dtype=np.int64)
