"""Write a run as a folder that Hugging Face transformers loads on its own. Every format builds
its folder through ``exporting.folder`` and loads the run through ``rundir.loading.load_run``."""

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from common.files import atomic_write_bytes
from exporting.folder import prepare_destination, staged_export
from exporting.hub_files import (
    SpecialTokens, chat_template, generation_config, model_config, model_name, write_json, write_tokenizer_files,
)
from exporting.hf.model_card import model_card
from exporting.hf.weights import hf_state_dict
from model.config import GPTConfig
from rundir.loading import load_run
from rundir.record import RunRecord

SHIPPED_FILES = ("configuration_minigpt.py", "modeling_minigpt.py")


@dataclass(frozen=True)
class ExportResult:
    """What an export (hf, llama or gguf) wrote: where, whether with the chat template, and the
    model's size and window."""

    out_dir: Path
    chat_template: bool
    num_params: int
    block_size: int


def export_run(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> ExportResult:
    """Export the run in ``run_dir`` to ``out_dir``; an existing ``out_dir`` is replaced only with
    ``overwrite``, and only if it is an earlier export (so a typo cannot delete a run)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    prepare_destination(run_dir, out_dir, overwrite)
    run = load_run(run_dir, torch.device("cpu"))
    tokens = SpecialTokens.of(run.tokenizer)
    template = chat_template(run_dir, tokens)
    config = run.model.config
    weights = hf_state_dict(run.model)
    num_params = run.model.num_params()

    with staged_export(out_dir, overwrite) as staging:
        config_json = model_config(config, tokens, weights_dtype(weights))
        write_model_files(staging, run_dir, config, tokens, template, weights, config_json)
        shipped = resources.files("exporting.hf.shipped")
        for name in SHIPPED_FILES:
            (staging / name).write_bytes(shipped.joinpath(name).read_bytes())
        card = model_card(model_name(run_dir), config, num_params, RunRecord.read(run_dir), template is not None)
        (staging / "README.md").write_text(card, encoding="utf-8")
    return ExportResult(out_dir, template is not None, num_params, config.block_size)


def write_model_files(folder: Path, run_dir: Path, config: GPTConfig, tokens: SpecialTokens, template: str | None,
                      weights: dict[str, torch.Tensor], config_json: dict) -> None:
    """What a transformers folder holds besides code and card, for this format and the Llama one:
    ``model.safetensors``, ``config.json``, ``generation_config.json`` and the tokenizer files."""
    from safetensors.torch import save

    # Serialised in memory and written by Python, so a full disk is an OSError naming the file
    # (safetensors' own writer reports it as text); transformers accepts a safetensors file
    # only with this format tag in its metadata.
    atomic_write_bytes(folder / "model.safetensors", save(weights, metadata={"format": "pt"}))
    write_json(folder / "config.json", config_json)
    write_json(folder / "generation_config.json", generation_config(config, tokens))
    write_tokenizer_files(folder, run_dir, config, template)


def weights_dtype(weights: dict[str, torch.Tensor]) -> str:
    """The dtype config.json declares, as transformers names it (``float32``, ``bfloat16``)."""
    return str(next(iter(weights.values())).dtype).removeprefix("torch.")
