"""Root conftest: its presence puts the repository root on sys.path, so tests import
`model`, `data`, `training` and `inference` exactly as train.py and generate.py do."""

import os

# wandb must never prompt or reach for the network from a test.
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
