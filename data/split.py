"""Document-level train/validation split by a seeded hash of each document's stable id, so adding a
document moves no other one. The one exception keeps tiny corpora usable: if one side would be
empty, the document whose hash is nearest the threshold moves across.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

from common.errors import DataError


def validation_score(doc_id: str, seed: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, doc_id) (blake2b: Python's hash() is salted per
    process); below val_fraction means validation."""
    digest = hashlib.blake2b(f"{seed}\0{doc_id}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def hash_split(doc_ids: Sequence[str], val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, validation indices) into `doc_ids`, both non-empty and in corpus order."""
    if len(doc_ids) < 2:
        raise DataError(
            f"the corpus has {len(doc_ids)} document(s); holding whole documents out for "
            "validation needs at least 2: add documents (e.g. .txt files, one document each, or "
            "data.files.txt_document: paragraph) or use a source with a validation split"
        )
    scores = [validation_score(doc_id, seed) for doc_id in doc_ids]
    is_val = [score < val_fraction for score in scores]
    if not any(is_val):
        is_val[min(range(len(scores)), key=scores.__getitem__)] = True
    elif all(is_val):
        is_val[max(range(len(scores)), key=scores.__getitem__)] = False
    return [i for i, v in enumerate(is_val) if not v], [i for i, v in enumerate(is_val) if v]
