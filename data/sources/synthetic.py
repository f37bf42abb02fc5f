"""A synthetic corpus for watching an induction head form: random word sequences written twice.

Each document is L made-up words (L in ``min_words..max_words``), then the same L again. Every word
of the second copy after its first is predictable by finding the current word earlier and copying
what followed: what an induction head does. Words are consonant-vowel syllables with a leading
space, so byte-level BPE learns each as one token. Everything follows from ``seed``."""

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
