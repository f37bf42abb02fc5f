"""python evaluate.py refuses bad input with one line and exit code 2, before any lm-eval work."""

from __future__ import annotations

import sys

from eval_testkit import one_line_error as _one_line_error


def test_without_lm_eval_says_how_to_install_it(capsys, monkeypatch, random_run):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    _one_line_error(capsys, ["--run", str(random_run)], "lm-evaluation-harness", "pip install", "lm-eval")


def test_missing_run(capsys, tmp_path):
    _one_line_error(capsys, ["--run", str(tmp_path / "nope")], "does not exist")


def test_damaged_weights(capsys, random_run):
    (random_run / "model.safetensors").write_bytes(b"not a safetensors file")
    _one_line_error(capsys, ["--run", str(random_run)], "model.safetensors")


def test_damaged_config(capsys, random_run):
    (random_run / "config.yaml").write_text("data:\n  source: [unclosed\n")
    _one_line_error(capsys, ["--run", str(random_run)], "config.yaml")


def test_run_not_trained_on_the_plays(capsys, random_run):
    (random_run / "config.yaml").write_text("data:\n  source: files\n  files:\n    paths: [corpus.txt]\n")
    _one_line_error(capsys, ["--run", str(random_run)], "data.source=files", "shakespeare")


def test_unknown_task_and_bad_numbers(capsys, random_run):
    _one_line_error(capsys, ["--run", str(random_run), "--tasks", "shakespeare_bpb,arc_easy"], "arc_easy")
    _one_line_error(capsys, ["--run", str(random_run), "--items", "0"], "--items")


def test_context_window_too_short_for_the_choices(capsys, random_run):
    # run_testkit's model has a context of 32 tokens; a line of verse does not fit its small vocabulary.
    _one_line_error(capsys, ["--run", str(random_run), "--tasks", "shakespeare_next_line"],
                    "shakespeare_next_line", "block_size")
