"""evaluate_run: lm-eval on a short real run (e2e), its bits/byte train.py's and beating an untrained model;
its progress, a line for each stage and a bar for each kind of request lm-eval scores (minutes on a CPU;
the bars hand lm-eval its requests in parts, which changes no score); and its results as wandb summary
metrics of an offline run when the run's config turns wandb on."""

import io
import json
from pathlib import Path

import pytest

from evaluation.cli import main
from evaluation.runner import EvalSettings, evaluate_run
from evaluation.tasks import BPB_TASK, NEXT_LINE_TASK, TaskSettings
from run_testkit import build_run, tokenizer_without_chat
from tests.tracking.wandb_records import read_offline_runs

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


@pytest.mark.e2e  # two evaluations, each scoring a whole play: about a minute
def test_each_stage_has_a_line_and_lm_eval_a_bar_per_kind_of_request(tmp_path: Path):
    # A context long enough for the multiple-choice task's choices.
    run = build_run(tmp_path / "run", tokenizer_without_chat(), block_size=128)
    (run / "config.yaml").write_text("data:\n  source: shakespeare\nlogging:\n  wandb:\n    mode: disabled\n")
    # One document of each task (a play; a question, each of whose choices is a loglikelihood request).
    settings = EvalSettings(tasks=(BPB_TASK, NEXT_LINE_TASK), task_settings=TaskSettings(items=2), limit=1,
                            device="cpu")
    progress = io.StringIO()
    shown = evaluate_run(run, settings, progress=progress)
    # A bar's last state: what follows its last carriage return.
    lines = [line.split("\r")[-1] for line in progress.getvalue().splitlines() if line.strip("\r")]
    assert lines[:3] == [f"exporting {run} for lm-eval", "building the tasks from the held-out plays",
                         f"scoring {BPB_TASK}, {NEXT_LINE_TASK} with lm-eval on cpu"]
    bars = {line.split(":")[0]: line for line in lines[3:]}
    assert set(bars) == {"lm-eval loglikelihood", "lm-eval loglikelihood_rolling"}
    assert " 1/1 " in bars["lm-eval loglikelihood_rolling"]  # the one play
    done = bars["lm-eval loglikelihood"].split("|")[2].split()[0]  # "n/n": every choice scored
    assert done.split("/")[0] == done.split("/")[1] and int(done.split("/")[0]) > 1
    quiet = evaluate_run(run, settings)
    assert shown.metrics.keys() == quiet.metrics.keys()
    for name, value in quiet.metrics.items():
        assert shown.metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_results_reach_wandb_as_summary_metrics(random_run: Path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    (random_run / "config.yaml").write_text("data:\n  source: shakespeare\nlogging:\n  wandb:\n    mode: offline\n")
    # One play of bits/byte is enough to have numbers to log.
    report = evaluate_run(random_run, EvalSettings(tasks=("shakespeare_bpb",), limit=1))
    [logged] = read_offline_runs(random_run / "wandb")
    bpb = report.metrics["shakespeare_bpb/bits_per_byte"]
    assert logged.summary["eval/shakespeare_bpb/bits_per_byte"] == bpb and bpb > 0
    assert logged.exit_code == 0
    assert report.results_file == random_run / "eval" / "results.json" and report.results_file.is_file()
