"""Write a Llama-shaped run as a folder that transformers loads as ``LlamaForCausalLM``: the hf
format's files, with ``config.json`` under Llama's model type and without the shipped code."""

from __future__ import annotations

from pathlib import Path

from exporting.folder import staged_export
from exporting.hf.writer import ExportResult, weights_dtype, write_model_files
from exporting.hub_files import LLAMA_MODEL_TYPE, SpecialTokens, model_config
from exporting.llama.shape import load_llama_run
from model.config import GPTConfig


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
