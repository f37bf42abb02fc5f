"""python evaluate.py refuses bad input with one line and exit code 2, before any lm-eval work."""

import sys

import pytest

from evaluation.cli import main
from refusal_testkit import one_error_line

WRITES = {"weights": ("model.safetensors", "not a safetensors file"),
          "config": ("config.yaml", "data:\n  source: [unclosed\n"),
          "files": ("config.yaml", "data:\n  source: files\n  files:\n    paths: [corpus.txt]\n")}


@pytest.mark.parametrize("damage, flags, fragments", [
    ("no-lm-eval", [], ["lm-evaluation-harness", "pip install", "lm-eval"]),
    ("missing", [], ["does not exist"]),
    ("weights", [], ["model.safetensors"]),
    ("config", [], ["config.yaml"]),
    ("files", [], ["data.source=files", "shakespeare"]),  # not trained on the plays
    (None, ["--tasks", "shakespeare_bpb,arc_easy"], ["arc_easy"]),
    (None, ["--items", "0"], ["--items"]),
    # run_testkit's model has a context of 32 tokens; a line of verse does not fit its small vocabulary.
    (None, ["--tasks", "shakespeare_next_line"], ["shakespeare_next_line", "block_size"]),
])
def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch, random_run, damage, flags, fragments):
    run = random_run.parent / "nope" if damage == "missing" else random_run
    if damage == "no-lm-eval":
        monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    elif damage in WRITES:
        name, text = WRITES[damage]
        (run / name).write_text(text)
    one_error_line(main(["--run", str(run), *flags]), *capsys.readouterr(), *fragments)
