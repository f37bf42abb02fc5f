"""What a run reports as it goes, outside its own files: the ``logging:`` config section and the
Weights & Biases run. Training and evaluation both log here, so neither reaches into the other.

- ``tracking.wandb_logger``: ``WandbLogger``, a wandb run that can neither prompt nor fail a job, and
  ``LoggingConfig``, the ``logging:`` section.

The metrics file (metrics.jsonl) is part of the run directory and lives in ``rundir.metrics``.
Nothing here imports wandb until a run logs, so a reader of the config does not load it.
"""
