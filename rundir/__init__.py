"""The run directory that train.py writes and everything else reads, owned in one place:

- ``rundir.files``: the name of every file in it.
- ``rundir.lock``: the lock one training holds on it.
- ``rundir.checkpoint``: refusing to clobber another run; the trainer state, written and read.
- ``rundir.metrics``: metrics.jsonl, appended and read.
- ``rundir.record``: the run's config as written, its parent (parent.json), and ``RunRecord``, the
  summary of its training that the export's model card and evaluation report.
- ``rundir.loading``: finding a trained run and loading it for inference (model, tokenizer).

Nothing is imported here, so a reader that needs only a file name loads nothing else.
"""
