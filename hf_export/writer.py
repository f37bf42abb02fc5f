"""Write a run as a folder that Hugging Face transformers loads on its own.

The folder is built in a hidden sibling directory and renamed into place when complete, so an
interrupted export leaves the previous folder (or nothing) behind, never half of one
(``hf_export/staging.py``). The run is loaded through ``rundir.loading.load_run``: a run that
``generate.py`` refuses is refused here too. Filesystem failures (a full disk, a read-only folder)
surface as ``OSError`` naming the path, which the command line reports in one line.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from common.errors import UserError
from common.files import atomic_write_bytes
from hf_export.hub_files import MODEL_TYPE, SpecialTokens, generation_config, model_config, tokenizer_config
from hf_export.model_card import model_card
from hf_export.staging import clean_leftovers, staged_export
from hf_export.weights import hf_state_dict
from rundir.files import TOKENIZER_FILE
from rundir.loading import load_run
from rundir.record import RunRecord

SHIPPED_FILES = ("configuration_minigpt.py", "modeling_minigpt.py")


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    has_chat: bool
    num_params: int


def export_run(run_dir: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> ExportResult:
    """Export the run in ``run_dir`` to ``out_dir``; an existing ``out_dir`` is replaced only with
    ``overwrite``, and only if it is an earlier export (so a typo cannot delete a run)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    clean_leftovers(out_dir.parent)  # first: it may put back the export a killed one was replacing
    check_destination(run_dir, out_dir, overwrite)
    run = load_run(run_dir, torch.device("cpu"))
    tokens = SpecialTokens.of(run.tokenizer)
    config = run.model.config
    weights = hf_state_dict(run.model)
    num_params = run.model.num_params()
    dtype = str(next(iter(weights.values())).dtype).removeprefix("torch.")

    with staged_export(out_dir) as staging:
        from safetensors.torch import save

        # Serialised in memory and written by Python, so a full disk is an OSError naming the file
        # (safetensors' own writer reports it as text); transformers accepts a safetensors file
        # only with this format tag in its metadata.
        atomic_write_bytes(staging / "model.safetensors", save(weights, metadata={"format": "pt"}))
        _write_json(staging / "config.json", model_config(config, tokens, dtype))
        _write_json(staging / "generation_config.json", generation_config(config, tokens))
        _write_json(staging / "tokenizer_config.json", tokenizer_config(config, tokens))
        shutil.copyfile(run_dir / TOKENIZER_FILE, staging / "tokenizer.json")
        shipped = resources.files("hf_export.shipped")
        for name in SHIPPED_FILES:
            (staging / name).write_bytes(shipped.joinpath(name).read_bytes())
        card = model_card(out_dir.name, config, num_params, RunRecord.read(run_dir), tokens.has_chat)
        (staging / "README.md").write_text(card, encoding="utf-8")
    return ExportResult(out_dir, tokens.has_chat, num_params)


def is_export(directory: Path) -> bool:
    """Whether ``directory`` holds a folder written by ``export_run``."""
    try:
        return json.loads((directory / "config.json").read_text(encoding="utf-8")).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def check_destination(run_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Refuse, in one line, an ``out_dir`` that an export (of either format) must not write to."""
    blocking = next((parent for parent in out_dir.absolute().parents if parent.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise UserError(f"--out {out_dir} is inside {blocking}, which is a file; choose a folder elsewhere")
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise UserError(f"--out {out_dir} is a file; choose a new folder for the export")
    if run_dir.resolve() == out_dir.resolve() or out_dir.resolve() in run_dir.resolve().parents:
        raise UserError(f"--out {out_dir} holds the run being exported; choose a folder outside it")
    if not overwrite:
        raise UserError(f"--out {out_dir} already exists; pass --overwrite to replace it, or choose a new folder")
    if any(out_dir.iterdir()) and not is_export(out_dir):
        raise UserError(
            f"--out {out_dir} is not empty and is not an earlier export, so --overwrite will not delete it; "
            "choose a new folder"
        )


def _write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
