"""Starting a run from another run's weights (``train.init_from``): fine-tuning and continued
pretraining.

The parent fixes the model's shape (its ``model_config.json``; a ``model`` field that would change
it is an error naming the field) and the tokenizer (its ``tokenizer.json``). The optimizer, schedule
and step start fresh. ``parent.json`` (``rundir.record``) records the parent with a SHA-256 of its
weights, so a run whose loss measures itself against them resumes only against the same ones."""

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError
from data.tokenizer import load_tokenizer
from model.config import GPTConfig
from model.io import ModelFileError, load_model_config, load_pretrained
from rundir.files import MODEL_CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE
from training.resume_rules import SHAPE_KEYS


class InitFromError(UserError):
    """train.init_from names something that is not a usable parent run."""


@dataclass(frozen=True)
class ParentRun:
    directory: Path
    model_config: GPTConfig

    @property
    def tokenizer_file(self) -> Path:
        return self.directory / TOKENIZER_FILE

    @functools.cached_property
    def weights_sha256(self) -> str:
        """The SHA-256 of the parent's weights file, as this process first read it."""
        with open(self.directory / WEIGHTS_FILE, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()


def refuse_own_parent(init_from: str, out_dir: str) -> None:
    """A run cannot start from its own directory: replacing it would delete the parent before its
    weights are read. Any spelling of the same directory counts (``./runs/tiny/``, a symlink)."""
    parent, own = Path(init_from).expanduser(), Path(out_dir)
    same = parent.resolve() == own.resolve()
    if not same and parent.exists() and own.exists():
        same = os.path.samefile(parent, own)  # a bind mount, or a case-insensitive file system
    if same:
        raise InitFromError(
            f"train.init_from {init_from} is run.out_dir {out_dir}, the directory this run writes; "
            "set run.out_dir to a new directory (e.g. --set run.out_dir=runs/tiny-chat)"
        )


def find_parent(init_from: str | Path) -> ParentRun:
    """The run directory ``init_from`` names, checked to hold a model and its tokenizer."""
    directory = Path(init_from).expanduser()
    if not directory.is_dir():
        raise InitFromError(
            f"train.init_from: {directory} is not a run directory; point it at a directory written by train.py"
        )
    missing = [name for name in (MODEL_CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE) if not (directory / name).is_file()]
    if missing:
        raise InitFromError(
            f"train.init_from: {directory} is not a trained run (no {', '.join(missing)}); point it at a "
            "directory written by train.py"
        )
    try:
        return ParentRun(directory, load_model_config(directory))
    except ModelFileError as e:
        raise InitFromError(f"train.init_from: {e}; or use another run") from None


def model_section_from_parent(model: Any, parent: ParentRun) -> dict[str, Any]:
    """The ``model`` config section for a run starting from ``parent``: the parent's shape, with
    the config's other settings (dropout, norm_eps) on top. A shape field that differs is an error."""
    model = {} if model is None else model
    if not isinstance(model, dict):
        raise InitFromError("model must be a section (or left out with train.init_from)")
    inherited = parent.model_config.to_dict()
    for name in SHAPE_KEYS:
        if name in model and model[name] != inherited[name]:
            raise InitFromError(
                f"model.{name} is {model[name]!r} in the config but {inherited[name]!r} in the parent run "
                f"{parent.directory} (train.init_from); remove model.{name} or match the parent"
            )
    return {**inherited, **model}


def load_parent_weights(model: Any, parent: ParentRun) -> None:
    """Copy the parent's weights into ``model`` (same shape, checked by the config)."""
    try:
        source = load_pretrained(parent.directory)
    except ModelFileError as e:
        raise InitFromError(f"train.init_from: {e}") from None
    model.load_state_dict(source.state_dict())


def check_parent_tokenizer(parent: ParentRun, vocab_size: int) -> None:
    """The parent's tokenizer must fit its model: a tokenizer.json from another run does not."""
    size = load_tokenizer(parent.tokenizer_file).get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise InitFromError(
            f"train.init_from: {parent.tokenizer_file} has {size} tokens but the model's vocab_size is "
            f"{vocab_size}: it is not the tokenizer these weights were trained with; restore the run's own"
        )
