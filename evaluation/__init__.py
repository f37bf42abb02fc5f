"""Evaluation with lm-evaluation-harness (``python evaluate.py``): tasks built from a run's held-out
plays, run by lm-eval's ``hf`` model on the run's Hugging Face export, offline.

    from evaluation.runner import evaluate_run
    report = evaluate_run("runs/tiny")       # exports, builds the tasks, runs lm-eval
    print(report.table)                      # also saved as runs/tiny/eval/results.json

Nothing is imported here, so that ``evaluate.py`` can set up its signal handling before torch loads.
"""
