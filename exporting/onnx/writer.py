"""Write a run as a folder that ONNX Runtime decodes with no PyTorch: model.onnx, the tokenizer
files, config.json and a README.md with the decoding loop, in the layout of Hugging Face Optimum's
ONNX exports."""

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch

from common.errors import UserError
from exporting.folder import prepare_destination, staged_export
from exporting.hub_files import (
    SpecialTokens, chat_template, model_config, model_name, write_json, write_tokenizer_files,
)
from exporting.onnx.decoder import cache_entries
from exporting.onnx.graph import MIN_DYNAMIC_BLOCK_SIZE, export_graph
from exporting.onnx.readme import export_readme
from rundir.loading import load_run


@dataclass(frozen=True)
class OnnxExportResult:
    out_dir: Path
    static_batch: int | None  # None: the dynamic form
    num_params: int


def export_onnx(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False,
                static_batch: int | None = None) -> OnnxExportResult:
    """Export the run in ``run_dir`` to ``out_dir`` as an ONNX decoder: the dynamic form, or with
    ``static_batch`` the fixed-shape form for that many rows. ``overwrite`` as in
    ``exporting.hf.export_run``."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    _require_exporter()
    prepare_destination(run_dir, out_dir, overwrite)
    run = load_run(run_dir, torch.device("cpu"))
    model = run.model.float()
    if static_batch is None and model.config.block_size < MIN_DYNAMIC_BLOCK_SIZE:
        raise UserError(f"{run_dir} has a window of {model.config.block_size} tokens (model.block_size), and the "
                        f"dynamic ONNX form needs at least {MIN_DYNAMIC_BLOCK_SIZE} to be traced; add --static-shapes, "
                        "or export a run with a larger window")
    tokens = SpecialTokens.of(run.tokenizer)
    config = model_config(model.config, tokens, "float32")
    for shipped_code in ("auto_map", "architectures"):  # the modeling files stay with the hf format
        config.pop(shipped_code, None)
    # What the README's loop needs to build the inputs: each cached entry's (heads, dim) per token.
    config["onnx"] = {"shapes": "dynamic" if static_batch is None else "static", "batch_size": static_batch,
                      "cache": {name: list(shape) for name, shape in cache_entries(model).items()}}

    with staged_export(out_dir, overwrite) as staging:
        export_graph(model, staging / "model.onnx", static_batch=static_batch)
        write_json(staging / "config.json", config)
        write_tokenizer_files(staging, run_dir, model.config, chat_template(run_dir, tokens))
        readme = export_readme(model_name(run_dir), str(out_dir.absolute()), model, static_batch)
        (staging / "README.md").write_text(readme, encoding="utf-8")
    return OnnxExportResult(out_dir, static_batch, model.num_params())


def _require_exporter() -> None:
    """The exporter's packages are development dependencies: say how to get them, in one line."""
    missing = [name for name in ("onnx", "onnxscript") if not _importable(name)]
    if missing:
        names = " and ".join(missing)
        raise UserError(f"ONNX export needs {names}, which {'is' if len(missing) == 1 else 'are'} not installed; "
                        f"install with pip install {' '.join(missing)} (or pip install -r requirements-dev.txt)")


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True
