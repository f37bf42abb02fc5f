"""lm-eval on a short real run (e2e): its bits/byte is train.py's, and it beats an untrained model."""

import json
from pathlib import Path

import pytest

from evaluation.runner import EvalSettings, evaluate_run
from evaluation.tasks import TaskSettings
from evaluation.cli import main

pytest.importorskip("lm_eval")  # optional: requirements-dev.txt installs it

NEXT_LINE_ITEMS = 500


@pytest.mark.e2e
def test_lm_eval_bits_per_byte_agrees_with_train_py_on_the_same_text(trained_run: Path, capsys):
    assert main(["--run", str(trained_run), "--tasks", "shakespeare_bpb", "--wandb", "disabled"]) == 0
    out, err = capsys.readouterr()
    assert err == ""  # no progress bars, no note that a play is longer than the window
    assert "bits_per_byte" in out and "chance" in out
    saved = json.loads((trained_run / "eval" / "results.json").read_text())
    lm_eval_bpb = saved["metrics"]["shakespeare_bpb/bits_per_byte"]
    assert lm_eval_bpb < saved["chance"]["shakespeare_bpb/bits_per_byte"] - 1  # trained: far better than guessing
    final = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    train_bpb = [record for record in final if record.get("kind") == "final_eval"][-1]["val_bpb"]
    assert saved["train_val_bpb"] == train_bpb
    # Both score every token of the same plays once; only the windows differ (docs/results.md).
    assert abs(lm_eval_bpb - train_bpb) < 0.01, (lm_eval_bpb, train_bpb)

    # The same text: the documents are the validation split data preparation tokenized.
    meta = json.loads(next((trained_run.parent / "cache").glob("*/meta.json")).read_text())
    rows = [json.loads(line) for line in (trained_run / "eval" / "tasks" / "shakespeare_bpb.jsonl").open()]
    assert [row["play"] for row in rows] == meta["val_document_ids"]
    assert sum(len(row["text"].encode("utf-8")) for row in rows) == meta["splits"]["val"]["bytes"]


@pytest.mark.e2e
def test_a_trained_run_beats_an_untrained_one_on_the_next_line(trained_run: Path, untrained_run: Path):
    settings = EvalSettings(tasks=("shakespeare_next_line",), task_settings=TaskSettings(items=NEXT_LINE_ITEMS),
                            wandb_mode="disabled")
    trained = evaluate_run(trained_run, settings).metrics
    untrained = evaluate_run(untrained_run, settings).metrics
    # The same questions for both (the tasks come from the plays and the seed alone).
    assert (trained_run / "eval/tasks/shakespeare_next_line.jsonl").read_bytes() == \
        (untrained_run / "eval/tasks/shakespeare_next_line.jsonl").read_bytes()
    # After a short training a line's own likelihood still outweighs how well it follows the scene;
    # acc_mutual_info scores the choice by what the context adds, which is what training has taught.
    assert untrained["shakespeare_next_line/acc_mutual_info"] < 0.29
    assert trained["shakespeare_next_line/acc_mutual_info"] > untrained["shakespeare_next_line/acc_mutual_info"] + 0.02
