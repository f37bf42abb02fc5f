"""train.lora under torchrun (e2e): the adapters alone trained, written by rank 0, resumed on one process."""

import json

import pytest
import torch

from model.io import load_pretrained
from rundir.checkpoint import load_trainer_state
from launch_testkit import launch, ok, train_args


@pytest.mark.e2e
@pytest.mark.distributed
def test_a_lora_run_on_two_processes_trains_the_adapters_alone_and_resumes_on_one(small_overrides, tmp_path):
    parent, run = tmp_path / "parent", tmp_path / "lora"
    ok(launch(1, train_args(small_overrides, parent)))
    lora = [f"train.init_from={json.dumps(str(parent))}", "train.lora.rank=4", "train.lora.dropout=0.1",
            "train.optimizer=adamw", "train.lr=1e-2", "train.grad_accum_steps=2"]
    assert "LoRA: " in ok(launch(2, train_args(small_overrides, run, *lora))).stdout

    state = load_trainer_state(run)
    assert state["world_size"] == 2 and state["step"] == 4
    before = load_pretrained(parent).state_dict()
    for name, tensor in state["model"].items():
        if name.endswith("lora_B"):
            assert tensor.abs().max() > 0, name  # B started at zero: the adapters trained
        elif ".parametrizations." not in name or name.endswith(".original"):  # the rest is the adapters' own
            assert torch.equal(tensor, before[name.replace(".parametrizations.weight.original", ".weight")]), name
    assert (run / "adapter_model.safetensors").is_file() and (run / "adapter_config.json").is_file()

    resumed = ok(launch(1, [*train_args(small_overrides, run, *lora, "train.max_steps=6"), "--resume"]))
    assert "done: 6 steps" in resumed.stdout and load_trainer_state(run)["world_size"] == 1
