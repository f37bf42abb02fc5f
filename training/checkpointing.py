"""The run's checkpoint, whatever the run is (one process, ddp or fsdp), behind one interface.

Every checkpoint is the whole model (``model.safetensors``) and the trainer state
(``trainer_state.pt``: step, clocks, every rank's sampler and RNG streams). The weights and optimizer
state for ``--resume`` go inside the trainer state when the model is whole; under fsdp they go to a
``torch.distributed.checkpoint`` folder that every rank writes and a later run reshards. That folder
is written as ``<name>.partial`` and renamed; the trainer state names it, so a crash before that
state is replaced leaves the previous checkpoint whole. The random streams that the trainer state
holds are captured and restored here too."""

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.config import GPTConfig
from model.gpt import GPT
from rundir.checkpoint import save_checkpoint
from training.adapters import Adapters
from training.distributed import DistContext, decided_on_main
from training.optim import load_optimizer_state
from training.resume_rules import check_optimizer_groups


@dataclass(frozen=True)
class Checkpointer:
    """Saves and restores a run's model and optimizer with its trainer state; every rank calls each
    method. This one keeps them whole in the trainer state, written by rank 0."""

    run_dir: Path
    ctx: DistContext
    model_config: GPTConfig
    device: torch.device
    adapters: Adapters  # how the weights train: the plain model they make is what model.safetensors holds

    def whole_model(self, model: GPT) -> GPT | None:
        """The model whole on rank 0 (None on the others where it is sharded), e.g. to decode samples."""
        return model

    def save(self, model: GPT, optimizer: Any, state: dict[str, Any], *, weights: bool = True) -> None:
        """Write the checkpoint of the trainer ``state`` (rank 0's is kept) with the model's;
        ``weights``: ``model.safetensors`` gets these weights too (adapters merged in), else it
        keeps the weights it holds."""
        whole = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        plain = self.adapters.merged(model) if weights else None
        decided_on_main(self.ctx, lambda: save_checkpoint(self.run_dir, plain, {**state, **whole}))

    def restore(self, state: dict[str, Any], model: GPT, optimizer: Any) -> None:
        """Load the model and optimizer state of a saved trainer ``state``."""
        model.load_state_dict(state["model"])
        check_optimizer_groups(state["optimizer"], optimizer.state_dict(), self.run_dir)
        load_optimizer_state(optimizer, state["optimizer"])


def checkpointer_for(parallel: str, run_dir: Path, ctx: DistContext, model_config: GPTConfig,
                     device: torch.device, adapters: Adapters) -> Checkpointer:
    """The checkpoint of a run trained with ``train.parallel`` set to ``parallel``."""
    if parallel == "fsdp":
        from training.fsdp import ShardedCheckpointer  # the same methods, imported only under fsdp

        return ShardedCheckpointer(run_dir, ctx, model_config, device, adapters)
    return Checkpointer(run_dir, ctx, model_config, device, adapters)


# Every random stream training consumes (torch, CUDA, numpy, Python), captured as tensors, dicts,
# lists and scalars so that the trainer state holding them loads with ``weights_only=True``.
def capture_rng_state() -> dict[str, Any]:
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {"version": int(version), "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    keys = np_state["keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
