"""training.distributed: the single-process no-ops, the batch split, a real 2-process step, and under torchrun
(e2e) train.lora on tiny.yaml (its batch split, the adapters alone trained, written by rank 0, resumed on one)."""

import json

import pytest
import torch
from torch import nn

from common.errors import UserError
from launch_testkit import ROOT, TORCHRUN_VARS, launch, ok, train_args
from model.gpt import unwrap
from model.io import load_pretrained
from rundir.checkpoint import load_trainer_state
from training.distributed import (DistContext, all_reduce_mean, all_reduce_sum, barrier, gather_to_main,
    init_distributed, launched_by_torchrun, select_rank_state, shutdown, split_batch, sync_gradients, wrap_model)

# Batch split


@pytest.mark.parametrize("batch, accum, world, expected", [
    (8, 4, 1, (8, 4)),
    (8, 4, 2, (8, 2)),  # accumulation divides: the per-process batch stays as configured
    (8, 4, 4, (8, 1)),
    (8, 1, 2, (4, 1)),  # tiny.yaml under two processes: the per-process batch is halved
    (6, 3, 2, (3, 3)),
])
def test_split_batch_keeps_the_global_batch(batch, accum, world, expected):
    split = split_batch(batch, accum, world)
    assert (split.batch_size, split.micro_steps) == expected
    assert split.batch_size * split.micro_steps * world == batch * accum


# A single process: everything is a no-op


def test_single_process_context_without_torchrun(monkeypatch):
    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    assert not launched_by_torchrun()
    ctx = init_distributed("cpu")
    assert ctx == DistContext(device=torch.device("cpu"))
    assert ctx.is_main and not ctx.enabled and ctx.world_size == 1

    model = nn.Linear(3, 2)
    assert wrap_model(model, ctx) is model
    assert unwrap(model) is model
    t = torch.tensor([1.5, 2.5])
    assert all_reduce_mean(t, ctx) is t and all_reduce_sum(2.0, ctx) == 2.0
    assert gather_to_main({"a": 1}, ctx) == [{"a": 1}]
    barrier(ctx)
    shutdown(ctx)

    # Without DDP, sync_gradients(False) must not stop gradients from accumulating.
    for _ in range(2):
        with sync_gradients(model, enabled=False):
            model(torch.ones(1, 3)).sum().backward()
    assert torch.equal(model.bias.grad, torch.full((2,), 2.0))
    # torchrun with one process needs no process group.
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    ctx = init_distributed("cpu")
    assert not ctx.enabled and ctx.is_main
    assert not torch.distributed.is_initialized()
    # A rank's state, at the same and at a different world size.
    ctx = DistContext(rank=1, world_size=2, is_main=False, enabled=True)
    assert select_rank_state(["s0", "s1"], 2, ctx) == ("s1", None)
    assert select_rank_state(None, None, ctx) == (None, None)
    state, message = select_rank_state(["s0", "s1", "s2", "s3"], 4, ctx)
    assert state is None
    assert "saved with 4 process(es) on 2" in message and "resume with 4" in message
    # torchrun refuses a device that pins one GPU.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="use train.device=cuda .*CUDA_VISIBLE_DEVICES"):
        init_distributed("cuda:1")
    with pytest.raises(UserError, match="not supported with torchrun"):
        init_distributed("mps")
    # split_batch refuses when neither divides, naming what would work.
    with pytest.raises(UserError) as info:
        split_batch(9, 5, 2)
    message = str(info.value)
    assert "\n" not in message and "9 x 5 sequences" in message and "2 processes" in message
    assert "launch 3, 5, 9 processes" in message and "multiple of 2" in message


# Two real processes (gloo)


@pytest.fixture(scope="module")
def two_rank_steps(tmp_path_factory) -> dict:
    """Both two-rank measurements (``tests/scaling/two_rank_steps_worker.py``) from one torchrun."""
    out = tmp_path_factory.mktemp("two-ranks") / "result.json"
    ok(launch(2, [str(ROOT / "tests" / "scaling" / "two_rank_steps_worker.py"), str(out)], timeout=120))
    return json.loads(out.read_text())


@pytest.mark.distributed
def test_two_rank_step_equals_single_process_accumulation(two_rank_steps):
    assert two_rank_steps["world_size"] == 2 and two_rank_steps["backend"] == "gloo"

    for case, accum in (("A", 1), ("B", 2)):
        r = two_rank_steps["ddp"][case]
        assert r["accum"] == accum
        # wrap_model gave rank 1 (built from another seed) rank 0's weights ...
        assert r["start_max_diff_between_ranks"] == 0.0
        # ... both ranks took the same step ...
        assert r["max_diff_between_ranks"] == 0.0
        # ... and it is the step one process makes on the whole global batch.
        assert r["max_grad_diff_vs_single_process"] <= 1e-6 * r["max_grad"]
        assert r["max_param_change"] > 5e-4  # the step did move the weights (lr 1e-3)
        assert r["max_diff_vs_single_process"] < 1e-6
        assert r["loss"] == pytest.approx(r["single_process_loss"], rel=1e-6)
        # Only the last micro-step of each rank communicates.
        calls = r["calls_per_micro_step"]
        assert calls[:-1] == [0] * (accum - 1) and calls[-1] >= 1
    # A chat step takes the mean over every loss-bearing target of both ranks.
    result = two_rank_steps["chat"]
    assert result["loss"] == pytest.approx(result["expected_loss"], rel=1e-5)
    assert result["max_grad_diff"] <= 1e-5 * result["max_grad"]
    assert result["tokens"] == result["expected_tokens"]  # the step's tokens on both ranks


@pytest.mark.e2e  # two processes over a whole config: the default suite keeps the two-rank step tests
@pytest.mark.distributed
def test_a_lora_run_on_two_processes_trains_the_adapters_alone_and_resumes_on_one(small_overrides, tmp_path):
    parent, run = tmp_path / "parent", tmp_path / "lora"
    ok(launch(1, train_args(small_overrides, parent)))
    # tiny.yaml's grad_accum_steps 1: the two processes split its batch of 4 sequences of 32 tokens instead.
    lora = [f"train.init_from={json.dumps(str(parent))}", "train.lora.rank=4", "train.lora.dropout=0.1",
            "train.optimizer=adamw", "train.lr=1e-2"]
    assert "LoRA: " in ok(launch(2, train_args(small_overrides, run, *lora))).stdout

    state = load_trainer_state(run)
    assert state["world_size"] == 2 and state["step"] == 4 and state["tokens_seen"] == 4 * 4 * 32
    before = load_pretrained(parent).state_dict()
    for name, tensor in state["model"].items():
        if name.endswith("lora_B"):
            assert tensor.abs().max() > 0, name  # B started at zero: the adapters trained
        elif ".parametrizations." not in name or name.endswith(".original"):  # the rest is the adapters' own
            assert torch.equal(tensor, before[name.replace(".parametrizations.weight.original", ".weight")]), name
    assert (run / "adapter_model.safetensors").is_file() and (run / "adapter_config.json").is_file()

    resumed = ok(launch(1, [*train_args(small_overrides, run, *lora, "train.max_steps=6"), "--resume"]))
    assert "done: 6 steps" in resumed.stdout and load_trainer_state(run)["world_size"] == 1
