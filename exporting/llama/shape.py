"""Which runs are Llama models: the one place that decides, for the Llama folder and for GGUF.

Llama's block is ours with every option at its plain setting: rotary positions over the halves of
each head (transformers' convention, which ``model.gpt.rotary`` follows), grouped-query attention,
RMSNorm, a SwiGLU feed-forward, no biases, and a tied or untied head. Every small-model option that
changes what the model computes has no counterpart there, so a run that used one cannot be loaded
as Llama; ``zero_init`` and ``dropout`` only shape training and do not matter.
"""

from __future__ import annotations

from pathlib import Path

import torch

from common.errors import UserError
from exporting.folder import prepare_destination
from model import GPTConfig
from rundir.loading import LoadedRun, load_run


def llama_blockers(config: GPTConfig) -> list[str]:
    """Each option that keeps ``config`` from being a Llama model, as ``model.key is X (set Y)``;
    empty for a Llama-shaped run."""
    blockers = []
    if config.positions != "rope":
        blockers.append(f"model.positions is {config.positions} (Llama rotates queries and keys: set rope)")
    if config.attention != "gqa":
        blockers.append(f"model.attention is {config.attention} (set gqa)")
    if config.mlp != "swiglu":
        blockers.append(f"model.mlp is {config.mlp} (set swiglu)")
    for name in ("qk_norm", "residual_scalars", "value_embeddings"):
        if getattr(config, name):
            blockers.append(f"model.{name} is true (set false)")
    if config.logit_softcap is not None:
        blockers.append(f"model.logit_softcap is {config.logit_softcap:g} (set null)")
    return blockers


def require_llama_shape(config: GPTConfig, run_dir: Path, fmt: str) -> None:
    """Refuse, in one line naming every option in the way, a run that ``--format fmt`` cannot write."""
    blockers = llama_blockers(config)
    if blockers:
        raise UserError(f"{run_dir} cannot be exported as --format {fmt} (a Llama model): {'; '.join(blockers)}; "
                        "train a run with those settings, or export this one with --format hf")


def load_llama_run(run_dir: Path, out_dir: Path, overwrite: bool, fmt: str) -> LoadedRun:
    """The run in ``run_dir``, on the CPU, once ``out_dir`` may be written and the run is Llama-shaped."""
    prepare_destination(run_dir, out_dir, overwrite)
    run = load_run(run_dir, torch.device("cpu"))
    require_llama_shape(run.model.config, run_dir, fmt)
    return run
