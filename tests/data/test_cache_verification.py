"""A cache entry is trusted for its content, not its size: token files overwritten in place,
ids beyond the vocabulary and a meta.json that parses to the wrong shape all get the entry
rebuilt, and the rebuilt entry equals the original."""

import json

import numpy as np
import pytest

from common.errors import DataError
from data.prepared.text import PreparedData, prepare_data
from data.prepared.token_files import digest_token_file


def _same_size_garbage(data, fill: int | None = None) -> None:
    count = data.train_path.stat().st_size // np.dtype(data.dtype).itemsize
    random = np.random.default_rng(0).integers(0, data.vocab_size, count)
    (np.full(count, fill) if fill is not None else random).astype(data.dtype).tofile(data.train_path)


def _edit_meta(data, edit) -> None:
    meta = json.loads((data.directory / "meta.json").read_text())
    edit(meta)
    (data.directory / "meta.json").write_text(json.dumps(meta))


def _one_past_the_vocabulary_with_its_checksum(data) -> None:
    ids = np.array(data.val_tokens())
    ids[-1] = data.vocab_size
    ids.tofile(data.val_path)
    _edit_meta(data, lambda meta: meta["splits"]["val"].update(sha256=digest_token_file(data.val_path, data.dtype).sha256))


DAMAGES = {
    "random_in_range": (_same_size_garbage, "delete that cache entry"),
    "all_ff": (lambda data: _same_size_garbage(data, fill=np.iinfo(data.dtype).max), "delete that cache entry"),
    "meta_is_a_list": (lambda data: (data.directory / "meta.json").write_text("[]"), "delete that cache entry"),
    "meta_lost_checksum": (lambda data: _edit_meta(data, lambda meta: meta["splits"]["train"].pop("sha256")),
                           "delete that cache entry"),
    "out_of_range_with_a_matching_checksum": (_one_past_the_vocabulary_with_its_checksum, "token id 300, beyond the vocabulary"),
}


@pytest.mark.parametrize("damage, fragment", DAMAGES.values(), ids=DAMAGES)
def test_a_damaged_entry_is_refused_then_rebuilt_equal(files_cfg, damage, fragment):
    original = prepare_data(files_cfg, progress=False)
    before = [np.array(original.train_tokens()), np.array(original.val_tokens())]
    damage(original)
    with pytest.raises(DataError, match=fragment):
        PreparedData.open(original.directory)
    rebuilt = prepare_data(files_cfg, progress=False)
    assert rebuilt.directory == original.directory and all(np.array_equal(a, b) for a, b in zip([rebuilt.train_tokens(), rebuilt.val_tokens()], before))


def test_recorded_digest_equals_a_fresh_read(files_cfg):
    data = prepare_data(files_cfg, progress=False)
    for split, path in (("train", data.train_path), ("val", data.val_path)):
        recorded = data.meta["splits"][split]
        found = digest_token_file(path, data.dtype)
        assert (found.sha256, found.max_id) == (recorded["sha256"], recorded["max_id"])
        assert found.max_id == int(np.array(np.memmap(path, dtype=data.dtype, mode="r")).max())
