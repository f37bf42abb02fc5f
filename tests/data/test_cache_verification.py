"""A cache entry is trusted for its content, not its size: token files overwritten in place,
ids beyond the vocabulary and a meta.json that parses to the wrong shape all get the entry
rebuilt, and the rebuilt entry equals the original."""

from __future__ import annotations

import json

import numpy as np
import pytest

from data.errors import DataError
from data.prepared.text import PreparedData, prepare_data
from data.prepared.token_files import digest_token_file


def _same_size_garbage(path, dtype, high: int, fill: int | None = None) -> None:
    count = path.stat().st_size // np.dtype(dtype).itemsize
    rng = np.random.default_rng(0)
    ids = np.full(count, fill, dtype=dtype) if fill is not None else rng.integers(0, high, count).astype(dtype)
    ids.tofile(path)


@pytest.mark.parametrize("damage", ["random_in_range", "all_ff", "meta_is_a_list", "meta_lost_checksum"])
def test_damaged_entry_is_refused_then_rebuilt_equal(files_cfg, damage):
    original = prepare_data(files_cfg, progress=False)
    train_before = np.array(original.train_tokens())
    entry = original.directory
    if damage == "random_in_range":
        _same_size_garbage(original.train_path, original.dtype, original.vocab_size)
    elif damage == "all_ff":
        _same_size_garbage(original.train_path, original.dtype, 0, fill=np.iinfo(original.dtype).max)
    elif damage == "meta_is_a_list":
        (entry / "meta.json").write_text("[]")
    else:
        meta = json.loads((entry / "meta.json").read_text())
        del meta["splits"]["train"]["sha256"]
        (entry / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="delete that cache entry"):
        PreparedData.open(entry)
    rebuilt = prepare_data(files_cfg, progress=False)
    assert rebuilt.directory == entry
    assert np.array_equal(np.array(rebuilt.train_tokens()), train_before)


def test_out_of_range_ids_are_refused_even_with_a_matching_checksum(files_cfg):
    data = prepare_data(files_cfg, progress=False)
    ids = np.array(data.val_tokens())
    ids[-1] = data.vocab_size  # one past the end
    ids.tofile(data.val_path)
    meta = json.loads((data.directory / "meta.json").read_text())
    meta["splits"]["val"]["sha256"] = digest_token_file(data.val_path, data.dtype).sha256
    (data.directory / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=f"token id {data.vocab_size}, beyond the vocabulary"):
        PreparedData.open(data.directory)


def test_recorded_digest_equals_a_fresh_read(files_cfg):
    data = prepare_data(files_cfg, progress=False)
    for split, path in (("train", data.train_path), ("val", data.val_path)):
        recorded = data.meta["splits"][split]
        found = digest_token_file(path, data.dtype)
        assert (found.sha256, found.max_id) == (recorded["sha256"], recorded["max_id"])
        assert found.max_id == int(np.array(np.memmap(path, dtype=data.dtype, mode="r")).max())
