"""Atomic writes: the target holds the old content or the new, never a torn mix or a leftover. (Each file gets
the mode a plain open would give: test_train_cli.py's run files.)"""

from pathlib import Path

import pytest

from common.files import atomic_output, atomic_write_text


def test_a_write_replaces_the_file_or_an_error_mid_write_keeps_it_and_no_temporary_is_left(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.txt"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.txt"]
    with pytest.raises(RuntimeError):  # an error mid-write keeps the old file
        with atomic_output(target) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("killed mid-write")
    assert target.read_text() == "second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.txt"]
