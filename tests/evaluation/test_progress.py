"""evaluate.py's progress: a line for each stage, and a bar for each kind of request lm-eval scores,
which take minutes on a CPU; the bars hand lm-eval its requests in parts, which changes no score."""

import io
from pathlib import Path

import pytest

from evaluation.runner import EvalSettings, evaluate_run
from evaluation.tasks import BPB_TASK, NEXT_LINE_TASK, TaskSettings
from run_testkit import build_run, tokenizer_without_chat

pytest.importorskip("lm_eval")  # optional: requirements-dev.txt installs it


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
