"""What a run reports outside its own files: the ``logging:`` section and the Weights & Biases run
(``wandb_logger``), which training and evaluation both log through. Nothing here imports wandb until a
run logs, so a reader of the config does not load it."""
