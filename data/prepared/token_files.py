"""Checksums of the flat token files, recorded when written and verified when opened, with every id
below the vocabulary size, so a file overwritten in place is rebuilt rather than trained on. Both
checks run in one sequential read; SHA-256 hashes faster than a disk reads (docs/results.md,
"Hardening")."""

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import DataError

_CHUNK_BYTES = 64 * 2**20


@dataclass(frozen=True)
class TokenFileDigest:
    sha256: str
    max_id: int  # -1 for an empty file


class TokenDigester:
    """Hashes token arrays as they are appended to a file, in file order."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._max = -1

    def update(self, ids: np.ndarray) -> None:
        self._hash.update(memoryview(np.ascontiguousarray(ids)).cast("B"))
        if ids.size:
            self._max = max(self._max, int(ids.max()))

    def digest(self) -> TokenFileDigest:
        return TokenFileDigest(self._hash.hexdigest(), self._max)


def digest_token_file(path: Path, dtype: np.dtype) -> TokenFileDigest:
    """Hash ``path`` and find its largest id, reading it once in chunks (constant memory)."""
    digester = TokenDigester()
    itemsize = np.dtype(dtype).itemsize
    size = min(_CHUNK_BYTES, max(path.stat().st_size, itemsize))
    buffer = bytearray(size - size % itemsize)  # reused: no allocation per chunk
    with open(path, "rb", buffering=0) as f:
        while read := f.readinto(buffer):
            digester.update(np.frombuffer(buffer, dtype=dtype, count=read // itemsize))
    return digester.digest()


def check_one_window(split: str, n_tokens: int, block_size: int) -> None:
    """A split must hold at least one window: block_size + 1 tokens (inputs and shifted targets)."""
    if n_tokens < block_size + 1:
        raise DataError(
            f"the {split} split has {n_tokens} tokens, fewer than one block of "
            f"block_size + 1 = {block_size + 1}: lower model.block_size or use a larger corpus"
        )


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (half the disk and page cache of uint32), else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
