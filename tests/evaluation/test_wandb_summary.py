"""With wandb on in the run's config, the results become summary metrics of an offline wandb run."""

from pathlib import Path

import pytest

from evaluation.runner import EvalSettings, evaluate_run
from run_testkit import build_run, tokenizer_without_chat
from tests.tracking.wandb_records import read_offline_runs

pytest.importorskip("lm_eval")  # optional: requirements-dev.txt installs it


def test_results_reach_wandb_as_summary_metrics(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = build_run(tmp_path / "run", tokenizer_without_chat())
    (run / "config.yaml").write_text("data:\n  source: shakespeare\nlogging:\n  wandb:\n    mode: offline\n")
    # One play of bits/byte is enough to have numbers to log.
    report = evaluate_run(run, EvalSettings(tasks=("shakespeare_bpb",), limit=1))
    [logged] = read_offline_runs(run / "wandb")
    bpb = report.metrics["shakespeare_bpb/bits_per_byte"]
    assert logged.summary["eval/shakespeare_bpb/bits_per_byte"] == bpb and bpb > 0
    assert logged.exit_code == 0
    assert report.results_file == run / "eval" / "results.json" and report.results_file.is_file()
