"""Training: config, loop, optimizer and schedule, checkpoints, metrics, distributed (wandb logging is ``tracking``)."""

from training.config import Config, ConfigError, config_from_dict, config_to_dict, load_run_config, save_config
from training.trainer import NonFiniteLossError, TrainResult, train

__all__ = ["Config", "ConfigError", "NonFiniteLossError", "TrainResult", "config_from_dict",
           "config_to_dict", "load_run_config", "save_config", "train"]
