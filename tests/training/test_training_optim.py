"""Parameter groups for weight decay, and the warmup + cosine schedule by steps and by time."""

import math

import pytest
import torch
from torch import nn

from model.config import GPTConfig
from model.gpt import GPT
from training.config import TrainConfig
from training.muon import Muon
from training.optim import (LRSchedule, build_optimizer, build_schedule, decayed_and_not, plan_param_groups,
                            planned_steps, set_learning_rate)


def tiny_gpt(**options) -> GPT:
    torch.manual_seed(0)
    shape = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32)
    return GPT(GPTConfig(**{**shape, **options}))


def test_weight_decay_only_on_linear_weights_and_the_optimizer_applies_it_so():
    model = tiny_gpt()
    decay, no_decay = decayed_and_not(model)
    decayed = {id(p) for p in decay}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    # Linear weights other than the (tied) output head are decayed; nothing else is.
    assert decayed == linear - embeddings and not decayed & embeddings
    assert all(p.ndim < 2 or id(p) in embeddings for p in no_decay)
    # Every trainable tensor sits in exactly one group.
    all_params = {id(p) for p in model.parameters()}
    assert decayed | {id(p) for p in no_decay} == all_params and len(decay) + len(no_decay) == len(all_params)
    groups = plan_param_groups(model, TrainConfig(max_steps=1, weight_decay=0.1))
    assert [(g.name, g.weight_decay) for g in groups] == [("matrices", 0.1), ("other", 0.0)]
    # The optimizer applies it so: norms and embeddings are never decayed.
    cfg = TrainConfig(max_steps=1, weight_decay=0.5, lr=1e-2)
    opt = build_optimizer(plan_param_groups(model, cfg), cfg, torch.device("cpu"))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    # With zero gradients Adam's update is zero, so any change is the decay alone.
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for name, p in model.named_parameters():
        changed = not torch.equal(p, before[name])
        is_matrix = p.ndim >= 2 and "wte" not in name and "wpe" not in name and "emb" not in name
        assert changed == is_matrix, name


def test_warmup_then_cosine_to_the_floor():
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110, max_seconds=None)
    for step in range(10):
        assert s(step) == pytest.approx((step + 1) / 10), step  # warmup: a straight line to the peak
    # Then a half cosine to the floor, which a linear (or any other) decay through the same ends and
    # midpoint is not: at a quarter of the way it is 0.868, a straight line 0.775.
    for step in range(10, 111):
        progress = (step - 10) / 100
        assert s(step) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * progress)), abs=1e-12), step
    assert s(35) == pytest.approx(0.868, abs=1e-3) and s(500) == pytest.approx(0.1)  # never below the floor


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_fraction():
    s = LRSchedule(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110, max_seconds=None, shape="wsd",
                   decay_fraction=0.4)
    assert [s(4), s(10), s(70)] == pytest.approx([0.5, 1.0, 1.0])  # cosine's warmup; 70: the stable phase's end
    assert [s(80), s(90), s(110), s(500)] == pytest.approx([1.0 - 0.9 * 0.25, 0.55, 0.1, 0.1])  # down the ramp
    lrs = [s(i) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    # The clock drives it the same way when time binds.
    timed = LRSchedule(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=None, max_seconds=100.0, shape="wsd",
                       decay_fraction=0.5)
    assert timed(7, elapsed_s=40.0) == pytest.approx(1.0) and timed(7, elapsed_s=75.0) == pytest.approx(0.5)


def test_time_budget_drives_the_decay_when_it_binds():
    s = LRSchedule(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=1000, max_seconds=100.0)
    # Few steps done, but the clock is half gone: progress follows the clock.
    assert s(10, elapsed_s=50.0) == pytest.approx(0.5) and s(10, elapsed_s=100.0) == pytest.approx(0.0)
    # Steps ahead of the clock: progress follows the steps.
    assert s(500, elapsed_s=1.0) == pytest.approx(0.5)
    time_only = LRSchedule(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=None, max_seconds=60.0)
    assert time_only(12345, elapsed_s=15.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))


def test_the_config_becomes_the_schedule():
    cfg = TrainConfig(max_steps=None, max_tokens=10_000)
    assert planned_steps(cfg, tokens_per_step=1000) == 10
    assert planned_steps(cfg, tokens_per_step=3000) == 4  # rounded up: the budget is reached
    both = TrainConfig(max_steps=5, max_tokens=10_000)
    assert planned_steps(both, tokens_per_step=1000) == 5
    timed = build_schedule(TrainConfig(max_minutes=2.0), 100)
    assert (timed.max_steps, timed.max_seconds, timed.shape) == (None, 120.0, "cosine")
    schedule = build_schedule(TrainConfig(max_steps=100, lr_schedule="wsd", lr_decay_fraction=0.3), 10)
    assert (schedule.shape, schedule.decay_fraction) == ("wsd", 0.3)  # the config picks the shape


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = tiny_gpt()
    cfg = TrainConfig(max_steps=1, optimizer="muon", lr=1e-3, muon_lr=0.05, weight_decay=0.2)
    groups = plan_param_groups(model, cfg)
    opt = build_optimizer(groups, cfg, torch.device("cpu"))
    muon = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    adamw = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    assert muon == linear - embeddings  # attention and MLP matrices, not the tied head
    assert not muon & adamw and muon | adamw == {id(p) for p in model.parameters()}
    assert isinstance(opt.muon, Muon) and isinstance(opt.adamw, torch.optim.AdamW)
    assert opt.muon.param_groups[0]["weight_decay"] == 0.2
    assert all(g["weight_decay"] == 0.0 for g in opt.adamw.param_groups)
    # One schedule drives both: each group runs at lr * lr_scale, so Muon runs at muon_lr at the peak.
    assert [g.lr_scale for g in groups] == [pytest.approx(50.0), 1.0]
    set_learning_rate(opt, groups, 1e-3)
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(0.05), pytest.approx(1e-3)]
    assert opt.muon.param_groups[0]["lr"] == pytest.approx(0.05)
    set_learning_rate(opt, groups, 1e-3, momentum=0.9)  # Muon's momentum rides with the rates
    assert opt.muon.param_groups[0]["momentum"] == 0.9
    assert all("momentum" not in g and g["betas"] == (cfg.beta1, cfg.beta2) for g in opt.adamw.param_groups)
    # Both move their parameters, and zero_grad clears them all.
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    x = torch.randint(0, 64, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(not torch.equal(p, before[name]) and p.grad is None for name, p in model.named_parameters())


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_value_embedding_tables_run_at_their_own_rate(optimizer):
    model = tiny_gpt(value_embeddings=True)
    tables = {id(t.weight) for t in model.value_embs.values()}
    assert len(tables) == 1

    def table_groups(cfg):
        groups = plan_param_groups(model, cfg)
        opt = build_optimizer(groups, cfg, torch.device("cpu"))
        assert [len(g["params"]) for g in opt.param_groups] == [len(g.params) for g in groups]  # in order
        own = [g for g in groups if {id(p) for p in g.params} & tables]
        everything = [id(p) for g in opt.param_groups for p in g["params"]]
        assert sorted(everything) == sorted(id(p) for p in model.parameters())  # each once
        return groups, own

    groups, [own] = table_groups(TrainConfig(max_steps=1, optimizer=optimizer, lr=2e-3, value_embedding_lr=0.03))
    assert {id(p) for p in own.params} == tables  # the tables alone, undecayed, at 15x lr
    assert own.name == "value_tables" and own.weight_decay == 0.0 and own.lr_scale == pytest.approx(15.0)
    others = [g.lr_scale for g in groups if g is not own]
    assert others == pytest.approx([0.02 / 2e-3, 1.0] if optimizer == "muon" else [1.0, 1.0])  # muon_lr, rest
    # Unset: the same groups (a resume may set it), at lr.
    unset, [own] = table_groups(TrainConfig(max_steps=1, optimizer=optimizer, lr=2e-3))
    assert own.lr_scale == 1.0 and len(unset) == len(groups)
    # A model without tables has no such group, whatever the setting.
    plain = plan_param_groups(tiny_gpt(), TrainConfig(max_steps=1, optimizer=optimizer, value_embedding_lr=0.03))
    assert len(plain) == len(groups) - 1
