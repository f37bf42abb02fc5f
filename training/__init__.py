"""Training: config, loop, optimizer and schedule, checkpoints, metrics, distributed (wandb logging is ``tracking``).

``train`` runs a whole training. The other names are the pieces the trainer is built from that
others may use too (the benchmarks time a step from them): the package promises these, not the
modules behind them.
"""

from training.config import (Config, ConfigError, TrainConfig, config_from_dict, config_to_dict, load_run_config,
                             save_config)
from training.device import autocast, configure_backends, resolve_precision, synchronize
from training.distributed import DistContext, barrier, init_distributed, shutdown, wrap_model
from training.memory_budget import estimate_memory
from training.metrics import format_flops, peak_flops
from training.optim import build_optimizer, plan_param_groups
from training.rms_norm_cpu import install_cpu_backward
from training.tasks.chat import evaluate_chat
from training.tasks.task import accumulate_gradients
from training.result import TrainResult
from training.trainer import NonFiniteLossError, clip_gradients, train

__all__ = ["Config", "ConfigError", "DistContext", "NonFiniteLossError", "TrainConfig", "TrainResult",
           "accumulate_gradients", "autocast", "barrier", "build_optimizer", "clip_gradients", "config_from_dict",
           "config_to_dict", "configure_backends", "estimate_memory", "evaluate_chat", "format_flops",
           "init_distributed", "install_cpu_backward", "load_run_config", "peak_flops", "plan_param_groups",
           "resolve_precision", "save_config", "shutdown", "synchronize", "train", "wrap_model"]
