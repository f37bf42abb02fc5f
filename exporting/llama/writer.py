"""Write a Llama-shaped run as a folder that transformers loads as ``LlamaForCausalLM``: the hf
format's files, with ``config.json`` under Llama's model type and without the shipped code.

A run for either Llama format (this folder and GGUF) is refused first, from its config alone, when
it is not Llama-shaped, then loaded once, with its weights under transformers' Llama names."""

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from common.errors import UserError
from exporting.folder import prepare_destination, staged_export
from exporting.hf.weights import hf_state_dict
from exporting.hf.writer import ExportResult, weights_dtype, write_model_files
from exporting.hub_files import LLAMA_MODEL_TYPE, SpecialTokens, chat_template, model_config
from model.config import GPTConfig
from model.io import ModelFileError, load_model_config
from rundir.loading import load_run


def export_llama(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> ExportResult:
    """Export the Llama-shaped run in ``run_dir`` to ``out_dir`` (``overwrite`` as in
    ``exporting.hf.export_run``); any other run is refused, naming the options in the way."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    run = load_llama_run(run_dir, out_dir, overwrite, "llama")
    with staged_export(out_dir, overwrite) as staging:
        config_json = llama_config(run.config, run.tokens, weights_dtype(run.weights))
        write_model_files(staging, run_dir, run.config, run.tokens, run.chat_template, run.weights, config_json)
    return ExportResult(out_dir, run.chat_template is not None, run.num_params, run.config.block_size)


def llama_config(config: GPTConfig, tokens: SpecialTokens, dtype: str) -> dict:
    """``config.json`` for transformers' ``LlamaConfig``. ``rope_theta`` is the name every
    transformers release reads (5 moves it into ``rope_parameters`` itself)."""
    shipped = model_config(config, tokens, dtype)
    for minigpt_only in ("auto_map", "positions", "rotary_base"):
        del shipped[minigpt_only]
    return shipped | {
        "architectures": ["LlamaForCausalLM"],
        "model_type": LLAMA_MODEL_TYPE,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rope_theta": config.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
    }


def require_llama_shape(config: GPTConfig, run_dir: Path, fmt: str) -> None:
    """Refuse, in one line naming every option in the way, a run that ``--format fmt`` cannot write."""
    blockers = config.llama_blockers()
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
