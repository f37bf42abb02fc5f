"""A run loaded for a Llama format (the Llama folder and GGUF): refused first, from its config alone,
when it is not Llama-shaped, then loaded once, with its weights under transformers' Llama names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from common.errors import UserError
from exporting.folder import prepare_destination
from exporting.hf.weights import hf_state_dict
from exporting.hub_files import SpecialTokens, chat_template
from model.config import GPTConfig
from model.io import ModelFileError, load_model_config
from model.layer_map import llama_blockers
from rundir.loading import load_run


def require_llama_shape(config: GPTConfig, run_dir: Path, fmt: str) -> None:
    """Refuse, in one line naming every option in the way, a run that ``--format fmt`` cannot write."""
    blockers = llama_blockers(config)
    if blockers:
        raise UserError(f"{run_dir} cannot be exported as --format {fmt} (a Llama model): {'; '.join(blockers)}; "
                        "train a run with those settings, or export this one with --format hf")


@dataclass(frozen=True)
class LlamaRun:
    """What both Llama formats write from. The weights are the hf format's (``exporting.hf.weights``),
    whose names for a Llama-shaped run are Llama's, with no other tensor."""

    config: GPTConfig
    tokenizer: Tokenizer
    tokens: SpecialTokens
    chat_template: str | None
    weights: dict[str, torch.Tensor]
    num_params: int


def load_llama_run(run_dir: Path, out_dir: Path, overwrite: bool, fmt: str) -> LlamaRun:
    """The Llama-shaped run in ``run_dir``, on the CPU, once ``out_dir`` may be written; the shape is
    checked before any weight is read (a config that cannot be read is ``load_run``'s to report)."""
    prepare_destination(run_dir, out_dir, overwrite)
    try:
        require_llama_shape(load_model_config(run_dir), run_dir, fmt)
    except ModelFileError:
        pass
    run = load_run(run_dir, torch.device("cpu"))
    tokens = SpecialTokens.of(run.tokenizer)
    return LlamaRun(run.model.config, run.tokenizer, tokens, chat_template(run_dir, tokens),
                    hf_state_dict(run.model), run.model.num_params())
