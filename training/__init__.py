"""Training: config, loop, optimizer and schedule, checkpoints, metrics, distributed (wandb logging is ``tracking``).

``training.trainer.train`` runs a whole training; ``training.cli`` is what train.py is a thin line
over. Nothing is imported here, so a run loads only the modules its config asks for."""
