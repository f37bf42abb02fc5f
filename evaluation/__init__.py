"""Evaluation with lm-evaluation-harness (``python evaluate.py``): tasks built from a run's held-out
plays, run by lm-eval's ``hf`` model on the run's Hugging Face export, offline.

    report = evaluate_run("runs/tiny")       # exports, builds the tasks, runs lm-eval
    print(report.table)                      # also saved as runs/tiny/eval/results.json
"""

from evaluation.runner import EvalReport, EvalSettings, evaluate_run
from evaluation.tasks import TASKS, TaskSettings, write_tasks

__all__ = ["EvalReport", "EvalSettings", "TaskSettings", "TASKS", "evaluate_run", "write_tasks"]
