"""A corpus that teaches a model to quote: passages of the plays, each written twice.

Each document is a passage, a blank line, and the same passage again; the second copy is predictable
by looking back and copying, which is what prompt-lookup speculative decoding needs
(inference/speculative.py; configs/tiny-quote.yaml, docs/results.md#speculative-decoding). A passage
is ``min_chars..max_chars`` characters from the start of a random line, cut back to a word's end.
The plays a text run with the same split holds out (``held_out_plays``) are the validation split, so
no held-out play is trained on. Everything follows from ``seed``."""

import random
from typing import Any

from data.config import DataConfig, QuotesSourceConfig
from data.sources.documents import SourceDocuments
from data.sources.shakespeare import held_out_plays, shakespeare_documents, shakespeare_fingerprint

# Bump when the passages below change, so cached corpora built by the old code are rebuilt.
GENERATOR_VERSION = 1


def quote_documents(cfg: QuotesSourceConfig) -> list[tuple[str, str]]:
    """(play id, document) pairs: each document a passage, a blank line, and the passage again."""
    ids, texts = shakespeare_documents()
    rng = random.Random(f"quotes-{cfg.seed}")
    documents = []
    for _ in range(cfg.passages):
        play = rng.randrange(len(ids))
        text = texts[play]
        start = text.find("\n", rng.randrange(len(text))) + 1  # 0 past the last line: the play's start
        cut = text[start:start + rng.randint(cfg.min_chars, cfg.max_chars)]
        passage = cut[:cut.rfind(" ")] if " " in cut.strip() else cut
        documents.append((ids[play], f"{passage}\n\n{passage}"))
    return documents


def spec(cfg: DataConfig) -> dict[str, Any]:
    """What decides the documents, for the cache key (the split decides which are held out)."""
    return {"type": "quotes", "version": GENERATOR_VERSION, **vars(cfg.quotes), **shakespeare_fingerprint()}


def load(cfg: DataConfig, progress: bool) -> SourceDocuments:
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    held_out = held_out_plays(cfg.val_fraction, cfg.split_seed)
    splits: dict[bool, tuple[list[str], list[str]]] = {False: ([], []), True: ([], [])}
    for i, (play, document) in enumerate(quote_documents(cfg.quotes)):
        ids, texts = splits[play in held_out]
        ids.append(f"{play}/{i}")
        texts.append(document)
    (train_ids, train), (val_ids, val) = splits[False], splits[True]
    q = cfg.quotes
    return SourceDocuments(f"passages of the plays written twice ({q.passages} of {q.min_chars}-{q.max_chars} "
                           "characters)", datasets.Dataset.from_dict({"text": train}), train_ids,
                           val=datasets.Dataset.from_dict({"text": val}), val_ids=val_ids,
                           val_split="held-out plays")
