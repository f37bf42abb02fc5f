"""A synthetic corpus for watching an induction head form: random word sequences written twice.

Each document is L words (L uniform in ``min_words..max_words``) drawn from a fixed list of
made-up words, then the same L words again. The first copy is unpredictable; every word of the
second copy after its first is predictable by looking back for the earlier occurrence of the
current word and copying what followed it. That is exactly what an induction head does, so a
small model that lowers its second-copy loss has built one.

The words are consonant-vowel syllables, each written with a leading space, so byte-level BPE
learns every word as one token: then a word is an id and a sequence of L words is L tokens.
Everything follows from ``seed``; no file or network is read.
"""

from __future__ import annotations

import random
from typing import Any

from data.config import DataConfig, SyntheticSourceConfig
from data.sources.documents import SourceDocuments

# Bump when the generator below changes, so cached corpora built by the old one are rebuilt.
GENERATOR_VERSION = 1

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def word_list(count: int, seed: int) -> list[str]:
    """``count`` distinct made-up words of two or three consonant-vowel syllables."""
    rng = random.Random(f"words-{seed}")
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    words: set[str] = set()
    while len(words) < count:
        words.add("".join(rng.choice(syllables) for _ in range(rng.choice((2, 3)))))
    return sorted(words)


def repeat_documents(cfg: SyntheticSourceConfig) -> list[str]:
    """The corpus's documents: each a random sequence of words written twice."""
    words = word_list(cfg.words, cfg.seed)
    rng = random.Random(f"documents-{cfg.seed}")
    documents = []
    for _ in range(cfg.documents):
        sequence = rng.sample(words, rng.randint(cfg.min_words, cfg.max_words))
        # The leading space makes the first word the same token as everywhere else.
        documents.append(" " + " ".join(sequence + sequence))
    return documents


def spec(data: DataConfig) -> dict[str, Any]:
    """What decides the documents, for the cache key."""
    return {"type": "synthetic", "version": GENERATOR_VERSION, **vars(data.synthetic)}


def load(data: DataConfig, progress: bool) -> SourceDocuments:
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    cfg = data.synthetic
    texts = repeat_documents(cfg)
    description = (f"synthetic repeats ({cfg.documents} documents of {cfg.min_words}-{cfg.max_words} words "
                   f"from {cfg.words}, written twice)")
    return SourceDocuments(description, datasets.Dataset.from_dict({"text": texts}),
                           [f"repeat-{i}" for i in range(len(texts))])
