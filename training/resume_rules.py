"""Which settings may change when a run is resumed, and the checks that refuse the others.

May change on ``--resume``: the budgets, learning rates and schedule, warmup, Muon's momentum, weight
decay, betas, eps, gradient clipping, ``train.batch_size`` and ``grad_accum_steps``, device, precision
(``auto`` keeps the run's own, ``run_precision``), compile, ``model.dropout``, and the whole ``eval``,
``logging`` and ``run`` sections.

May not change, because the saved state belongs to them: ``train.optimizer``, ``train.parallel``
(ddp saves whole tensors, fsdp a sharded folder), ``train.sampling`` and ``data.format`` (the
sampler's position), ``train.lora`` (the adapters' shape and scale), ``train.seed`` (the saved random
streams; a new seed would silently do nothing), the model's shape (``SHAPE_KEYS``) and the tokenizer
(both checked in ``Trainer.setup``)."""

import os
from pathlib import Path
from typing import Any

import torch

from common.config import read_yaml_file
from common.errors import UserError, one_line
from data.tokenizer import RUN_TOKENIZER_ADVICE, load_tokenizer
from model.config import GPTConfig
from rundir.checkpoint import CheckpointError
from rundir.files import METRICS_FILE, RUN_CONFIG_FILE, STATE_FILE, TOKENIZER_FILE
from rundir.metrics import read_metrics

FIXED_ON_RESUME = ("optimizer", "sampling", "seed", "parallel", "lora")
# The model keys that fix the shapes of the weights or what they compute, which neither a resume nor
# a run started from a parent (train.init_from) may change. dropout and norm_eps may.
SHAPE_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "ffn_hidden",
              "tie_embeddings", "attention", "kv_latent_dim", "q_latent_dim", "value_embeddings", "positions",
              "rope_theta")


def check_model_shape(saved: GPTConfig, current: GPTConfig, run_dir: Path) -> None:
    """Refuse to resume when the config would build a model of another shape."""
    for key in SHAPE_KEYS:
        attr = "ffn_dim" if key == "ffn_hidden" else key  # the width an unset ffn_hidden gives
        was, now = getattr(saved, attr), getattr(current, attr)
        if was != now:
            raise CheckpointError(
                f"cannot resume {run_dir}: model.{key} is {now!r} in the config but {was!r} in "
                f"the checkpoint; use the run's own config.yaml or start a new run"
            )


def fixed_settings(train_config: Any) -> dict[str, Any]:
    """The values saved with each checkpoint that a resumed run must keep."""
    values = {f"train.{key}": getattr(train_config, key) for key in FIXED_ON_RESUME}
    # A section (train.lora) is saved as a plain dict: the trainer state holds no Python objects.
    return {key: value.model_dump() if hasattr(value, "model_dump") else value
            for key, value in values.items()}


def check_fixed_settings(state: dict[str, Any], train_config: Any, run_dir: Path) -> None:
    """Refuse a resume that changes a setting the checkpoint depends on, naming the key."""
    saved = state.get("fixed_settings")
    if not isinstance(saved, dict):
        return  # a checkpoint from before these were recorded: the structural checks still apply
    if isinstance(saved.get("train.lora"), dict):
        # Saved before LoRA trained token rows: it trained none.
        saved = {**saved, "train.lora": {**saved["train.lora"],
                                         "trainable_tokens": saved["train.lora"].get("trainable_tokens", [])}}
    for key, now in fixed_settings(train_config).items():
        if key in saved and saved[key] != now:
            raise CheckpointError(
                f"cannot resume {run_dir}: {key} is {now!r} but the run was trained with "
                f"{saved[key]!r}, and it may not change on resume; set it back (drop the --set) or start a new run"
            )


def run_precision(state: dict[str, Any] | None, device: torch.device) -> str | None:
    """The precision (``fp32`` or ``bf16``) a resumed run trained in, which ``train.precision: auto``
    keeps; None for a new run. A checkpoint that does not say was saved when ``auto`` chose fp32 on
    every CPU: on a CPU it resumes in fp32, as it would have then (on a GPU ``auto`` chose as now)."""
    if state is None:
        return None
    saved = state.get("precision")
    if saved in ("fp32", "bf16"):
        return saved
    return "fp32" if device.type == "cpu" else None


def check_data_format(run_dir: Path, data_format: str) -> None:
    """Refuse to resume a run on another kind of data than its config.yaml says (an unreadable one
    leaves it to the structural checks when the state is restored)."""
    try:
        saved = read_yaml_file(run_dir / RUN_CONFIG_FILE)["data"].get("format", "text")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError):
        return
    if saved != data_format:
        raise CheckpointError(
            f"cannot resume {run_dir}: it was trained on {'conversations' if saved == 'chat' else 'text'} "
            f"(data.format: {saved}), and this config says data.format: {data_format}; resume with "
            f"data.format: {saved} (the run's own config.yaml), or start a new run"
        )


def threads_on_resume(state: dict[str, Any] | None, setting: int | str) -> int | None:
    """The thread count a resumed run keeps where ``train.threads`` is auto (None: none to keep): it
    decides how sums are split, so keeping it ends on the uninterrupted run's weights. A machine with
    fewer CPUs gives all it has."""
    if setting != "auto" or state is None or not isinstance(state.get("threads"), int):
        return None
    return min(state["threads"], os.cpu_count() or 1)


def check_resumed_tokenizer(run_dir: Path, tokenizer: Any) -> None:
    """Refuse to resume when the data section now builds another tokenizer than the run's own."""
    saved = run_dir / TOKENIZER_FILE
    if saved.is_file() and load_tokenizer(saved, RUN_TOKENIZER_ADVICE).get_vocab() != tokenizer.get_vocab():
        raise CheckpointError(f"cannot resume {run_dir}: the data section now builds a different tokenizer "
                              f"than the run was trained with; use the run's own config.yaml")


def check_run_tokenizer(run_dir: Path) -> None:
    """Refuse to resume a run whose tokenizer.json is gone (only a new run writes it), which every
    command that reads the run would then refuse."""
    if not (run_dir / TOKENIZER_FILE).is_file():
        raise CheckpointError(f"cannot resume {run_dir}: it has no {TOKENIZER_FILE}; {RUN_TOKENIZER_ADVICE}")


def check_not_finished(state: dict[str, Any], train_config: Any, run_dir: Path) -> None:
    """Refuse to resume a run that used up its budget and had its final validation (one stopped
    during that validation is not finished: resuming runs it)."""
    try:
        step, tokens, seconds = int(state["step"]), int(state["tokens_seen"]), float(state["train_seconds"])
    except (KeyError, ValueError, TypeError):
        return  # reported, with the rest of a state that does not fit, when it is restored
    budget = train_config.budget_reached(step, tokens, seconds)
    metrics = run_dir / METRICS_FILE
    records = read_metrics(metrics) if budget is not None and metrics.is_file() else []
    if not any(r.get("kind") == "final_eval" and r.get("step") == step for r in records):
        return
    if budget == "max_steps":
        used, larger = f"step {step}", f"train.max_steps={2 * step}"
    elif budget == "max_tokens":
        used, larger = f"{tokens:,} tokens", f"train.max_tokens={2 * tokens}"
    else:
        used, larger = f"{seconds / 60:.1f} minutes", f"train.max_minutes={2 * train_config.max_minutes:g}"
    raise CheckpointError(
        f"{run_dir} is finished: it reached train.{budget} ({used}) and had its final validation; to "
        f"train it further, raise train.max_steps or train.max_minutes, e.g. --resume --set {larger}"
    )


def _group_sizes(state: dict[str, Any]) -> list[int]:
    """Parameters per group of a saved optimizer state (Muon + AdamW saves one state per half)."""
    if not isinstance(state, dict):
        raise TypeError(f"an optimizer state is a {type(state).__name__}, not a dict")
    if "param_groups" in state:
        return [len(group["params"]) for group in state["param_groups"]]
    return [size for part in state.values() for size in _group_sizes(part)]


def check_optimizer_groups(saved: dict[str, Any], current: dict[str, Any], run_dir: Path) -> None:
    """Refuse an optimizer state whose parameters were grouped otherwise: saved before
    ``train.value_embedding_lr`` gave value-embedding tables their own group. The weights still serve
    a new run."""
    was, now = _group_sizes(saved), _group_sizes(current)
    if was != now:
        raise CheckpointError(
            f"cannot resume {run_dir}: its optimizer state groups the parameters as {was}, this version "
            f"as {now} (value-embedding tables have their own group since train.value_embedding_lr); "
            f"start a new run from its weights with --set train.init_from={run_dir} and another run.out_dir"
        )


def restore_error(run_dir: Path, error: Exception) -> CheckpointError:
    """A one-line error for a trainer state that does not fit the model, optimizer or sampler."""
    what = f"missing {error}" if isinstance(error, KeyError) else one_line(error)
    return CheckpointError(
        f"cannot resume {run_dir}: its {STATE_FILE} does not fit this config ({what}); resume with "
        f"the run's own config.yaml, or start a new run with --overwrite"
    )
