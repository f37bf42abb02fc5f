"""Which settings may change when a run is resumed, and the checks that refuse the others.

May change on ``--resume``: the budgets (``train.max_steps``, ``max_minutes``, ``max_tokens``),
learning rates and their schedule, warmup, Muon's momentum and its warm-up, weight decay, betas, eps, gradient clipping,
``train.batch_size`` and ``train.grad_accum_steps``, device, precision, compile, and the whole
``eval``, ``logging`` and ``run`` sections, plus ``model.dropout``.

May not change: ``train.optimizer`` (the saved optimizer state belongs to one optimizer),
``train.sampling`` (the saved sampler position belongs to one sampler), ``train.seed`` (the saved
random streams came from it; a new seed would silently do nothing), the model's shape
(``SHAPE_KEYS``) and the data section's tokenizer (both checked in ``Trainer.setup``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.errors import one_line
from training.checkpoint import CheckpointError

FIXED_ON_RESUME = ("optimizer", "sampling", "seed")


def fixed_settings(train_config: Any) -> dict[str, Any]:
    """The values saved with each checkpoint that a resumed run must keep."""
    return {f"train.{key}": getattr(train_config, key) for key in FIXED_ON_RESUME}


def check_fixed_settings(state: dict[str, Any], train_config: Any, run_dir: Path) -> None:
    """Refuse a resume that changes a setting the checkpoint depends on, naming the key."""
    saved = state.get("fixed_settings")
    if not isinstance(saved, dict):
        return  # a checkpoint from before these were recorded: the structural checks still apply
    for key, now in fixed_settings(train_config).items():
        if key in saved and saved[key] != now:
            raise CheckpointError(
                f"cannot resume {run_dir}: {key} is {now!r} but the run was trained with "
                f"{saved[key]!r}, and it may not change on resume; drop the --set or start a new run"
            )


def restore_error(run_dir: Path, error: Exception) -> CheckpointError:
    """A one-line error for a trainer state that does not fit the model, optimizer or sampler."""
    what = f"missing {error}" if isinstance(error, KeyError) else one_line(error)
    return CheckpointError(
        f"cannot resume {run_dir}: its trainer_state.pt does not fit this config ({what}); resume with "
        f"the run's own config.yaml, or start a new run with --overwrite"
    )
