"""Helpers for the evaluation tests. A plain module (not conftest) so tests can import it by a name
no other test directory uses."""

from __future__ import annotations


def one_line_error(capsys, argv: list[str], *fragments: str) -> str:
    """``evaluate.py argv`` refused its input: exit 2, nothing on stdout, one ``error:`` line holding
    each fragment; returns that line."""
    from evaluation.cli import main

    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
