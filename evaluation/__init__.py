"""Evaluation with lm-evaluation-harness (``python evaluate.py``, ``evaluation.runner.evaluate_run``):
tasks built from a run's held-out plays, run by lm-eval's ``hf`` model on the run's Hugging Face
export, offline, the results saved in the run's ``eval/results.json``.

Nothing is imported here, so that ``evaluate.py`` can set up its signal handling before torch loads."""
