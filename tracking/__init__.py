"""What a run reports as it goes, outside its own files: the ``logging:`` config section and the
Weights & Biases run. Training and evaluation both log here, so neither reaches into the other.

- ``tracking.config``: ``LoggingConfig`` and ``WandbConfig``, the ``logging:`` section.
- ``tracking.wandb_logger``: ``WandbLogger``, a wandb run that can neither prompt nor fail a job.

The metrics file (metrics.jsonl) is part of the run directory and lives in ``rundir.metrics``.
Nothing is imported here, so a reader of the config does not load wandb.
"""
