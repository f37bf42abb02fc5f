"""Training's side of a checkpoint: the optimizer continuing from one, RNG state round trips, the
shape a resume must keep, and MFU accounting (the files themselves: tests/rundir)."""

import copy
import json
import random
from contextlib import nullcontext

import numpy as np
import pytest
import torch

from model.config import GPTConfig
from model.gpt import GPT
from rundir.checkpoint import CheckpointError, load_trainer_state, save_checkpoint
from training.checkpointing import capture_rng_state, restore_rng_state
from training.config import TrainConfig
from training import metrics
from training.metrics import known_gpu_peak, measure_matmul_flops, mfu
from training.optim import build_optimizer, load_optimizer_state, plan_param_groups, set_learning_rate
from training.resume_rules import check_model_shape

SHAPE = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32)


def draws() -> tuple:
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_rng_states_survive_a_weights_only_round_trip(tmp_path):
    for seed, seeding in enumerate((torch.manual_seed, np.random.seed, random.seed), 1):
        seeding(seed)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    state = capture_rng_state()
    expected = draws()
    torch.save(state, tmp_path / "rng.pt")
    for seeding in (torch.manual_seed, np.random.seed, random.seed):
        seeding(99)
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draws() == expected


@pytest.mark.parametrize("legacy", [False, True], ids=["today", "lr-scale-keys"])
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_optimizer_continues_from_a_checkpoint(tmp_path, optimizer, legacy):
    # Earlier versions kept each group's scale as an "lr_scale" key in the optimizer's groups; their
    # checkpoints still resume, and the key does not come back into the groups (the plan owns it).
    cfg = TrainConfig(max_steps=1, optimizer=optimizer)
    models, plans, optimizers = [], [], []
    for seed in (0, 1):  # the one trained, then the one a resume builds (its weights are loaded)
        torch.manual_seed(seed)
        models.append(GPT(GPTConfig(**SHAPE)))
        plans.append(plan_param_groups(models[-1], cfg))
        optimizers.append(build_optimizer(plans[-1], cfg, torch.device("cpu")))
    (model, fresh), (opt, fresh_opt) = models, optimizers
    x = torch.randint(0, 64, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    saved = copy.deepcopy(opt.state_dict())
    for part in ([saved] if "param_groups" in saved else saved.values()) if legacy else []:
        for group in part["param_groups"]:
            group["lr_scale"] = 7.0  # whatever it was, the config's scale is the one that runs
    save_checkpoint(tmp_path, model, {"step": 1, "model": model.state_dict(), "optimizer": saved})
    state = load_trainer_state(tmp_path)
    fresh.load_state_dict(state["model"])
    load_optimizer_state(fresh_opt, state["optimizer"])
    assert all("lr_scale" not in g for g in fresh_opt.param_groups)
    # The optimizer continues identically: one more identical step gives identical weights. (The
    # weights and the model files round trip: tests/rundir/test_rundir_checkpoint.py.)
    for m, o, plan in zip(models, optimizers, plans):
        set_learning_rate(o, plan, 1e-3)
        m(x, x)[1].backward()
        o.step()
        o.zero_grad(set_to_none=True)
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("key, value, fragment", [
    ("n_layer", 3, "is 3 in the config but 2"), ("value_embeddings", True, "is True in the config but"),
    ("tie_embeddings", False, "is False in the config but"), ("positions", "rope", "is 'rope' in the config but"),
    ("rope_theta", 500.0, "is 500.0 in the config but"), ("dropout", 0.1, None),  # not a shape: it may change
])
def test_a_resume_may_not_change_the_models_shape_or_options_naming_the_key(tmp_path, key, value, fragment):
    with pytest.raises(CheckpointError, match=f"model.{key} {fragment}") if fragment else nullcontext():
        check_model_shape(GPTConfig(**SHAPE), GPTConfig(**{**SHAPE, key: value}), tmp_path)


def test_mfu_and_peaks():
    assert mfu(6e6, 1e5, 1.2e12) == pytest.approx(0.5)
    names = ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "Some Future GPU")
    assert [known_gpu_peak(name) for name in names] == [989e12, 756e12, 312e12, None]


def test_the_cpu_peak_is_the_best_measured_on_this_machine(tmp_path, monkeypatch):
    # A measurement under load (17 GFLOP/s), then a quiet one (55), then one under load again (30):
    # MFU is against the quiet one from then on, so other programs cannot make it read high.
    measured = iter([17e9, 55e9, 30e9, 8e9])
    monkeypatch.setattr(metrics, "measure_matmul_flops", lambda *args, **kwargs: next(measured))
    cache = tmp_path / "cache" / "peak_flops.json"
    cpu = torch.device("cpu")
    peaks = [metrics.peak_flops("auto", cpu, torch.float32, cache_file=cache) for _ in range(3)]
    assert [peak for peak, _ in peaks] == [17e9, 55e9, 55e9]
    source = peaks[-1][1]
    assert source == f"the fastest 1024x1024 float32 matmul measured here at {torch.get_num_threads()} thread" + (
        "s" if torch.get_num_threads() != 1 else "")
    # 6 MFLOP a token at 2,750 tokens/s is 16.5 GFLOP/s of model arithmetic: 30% of the best peak.
    assert mfu(6e6, 2750, peaks[-1][0]) == pytest.approx(0.3)
    assert list(json.loads(cache.read_text()).values()) == [55e9]
    # Another thread count is another peak; a setting in the config is taken as it is.
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        assert metrics.peak_flops("auto", cpu, torch.float32, cache_file=cache)[0] == 8e9
    finally:
        torch.set_num_threads(threads)
    assert metrics.peak_flops(1e11, cpu, torch.float32, cache_file=cache) == (1e11, "train.peak_flops")


def test_a_damaged_or_unwritable_peak_cache_only_costs_the_memory(tmp_path):
    damaged = tmp_path / "peak_flops.json"
    damaged.write_text("{not json")
    assert metrics.best_peak(20e9, "host cpu", damaged) == 20e9
    assert json.loads(damaged.read_text()) == {"host cpu": 20e9}
    unwritable = tmp_path / "a-file" / "peak_flops.json"
    (tmp_path / "a-file").write_text("")  # its folder cannot be made
    assert metrics.best_peak(20e9, "host cpu", unwritable) == 20e9


def test_measuring_the_peak_leaves_the_global_rng_alone():
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    assert measure_matmul_flops(torch.device("cpu"), size=64, max_seconds=0.05) > 0
    assert torch.equal(torch.rand(2), expected)
