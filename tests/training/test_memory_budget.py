"""training/memory_budget.py: the estimate's parts, the refusal before allocation, and (e2e) the
estimate against the measured peak of real training steps on the CPU; and absurd sizes refused before
anything is allocated (a model_config.json claiming a billion positions: tests/model/test_model_io.py)."""

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch

import training.tasks.grpo.task as rl_task
from common.config import ConfigError
from model.config import GPTConfig
from model.gpt import GPT
from training.config import TrainConfig, config_from_dict
from training.memory_budget import estimate_memory, plan_memory, plan_run_memory
from training.trainer import train as train_run

ROOT = Path(__file__).resolve().parents[2]
SMALL = GPTConfig(vocab_size=6400, block_size=512, n_layer=8, n_head=8, n_kv_head=2, n_embd=512)


def test_fsdp_divides_the_model_state_and_checkpointing_the_activations():
    train = TrainConfig(max_steps=1, batch_size=64, optimizer="adamw")
    ddp = estimate_memory(SMALL, train, world_size=4)
    fsdp = estimate_memory(SMALL, TrainConfig(max_steps=1, batch_size=64, parallel="fsdp"), world_size=4)
    params = SMALL.num_params()
    assert ddp.weights == ddp.gradients == 4 * params and ddp.optimizer == 8 * params
    # A quarter of the model, plus the two blocks gathered whole at a time.
    assert ddp.weights / 4 < fsdp.weights < ddp.weights / 2 and fsdp.activations == ddp.activations
    recomputed = estimate_memory(SMALL, TrainConfig(max_steps=1, batch_size=64, activation_checkpointing=True))
    assert recomputed.activations < 0.7 * ddp.activations  # the logits stay: 6400 values a token
    assert estimate_memory(SMALL, train, bf16=True).activations < ddp.activations


@pytest.mark.parametrize("plan, fragments", [
    (lambda: plan_memory(SMALL, TrainConfig(max_steps=1, batch_size=64), torch.device("cpu"), world_size=2,
                         micro_batch=64, bf16=False),
     ["would not fit: memory per device: about", "of 1.00 GiB on cpu", "lower train.batch_size",
      "train.activation_checkpointing=true", "set train.parallel=fsdp (about"]),
    (lambda: plan_run_memory(_rl_config(1024, batch_size=64), torch.device("cpu"), world_size=1, micro_batch=64,
                             bf16=False), ["would not fit", "lower train.batch_size, rl.group_size"]),
], ids=["text", "rl"])
def test_a_run_that_would_not_fit_is_refused_with_the_estimate_and_what_to_change(monkeypatch, plan, fragments):
    monkeypatch.setattr("training.memory_budget.device_memory_bytes", lambda device: 2**30)
    with pytest.raises(ConfigError) as info:
        plan()
    message = str(info.value)
    assert "\n" not in message and all(fragment in message for fragment in fragments), message


def test_a_run_that_fits_gets_one_line_of_its_estimate(monkeypatch):
    monkeypatch.setattr("training.memory_budget.device_memory_bytes", lambda device: 2**30)
    tiny = GPTConfig(vocab_size=256, block_size=32, n_layer=1, n_head=2, n_kv_head=2, n_embd=32)
    line = plan_memory(tiny, TrainConfig(max_steps=1, batch_size=64), torch.device("cpu"), world_size=1, micro_batch=4,
                       bf16=False)
    assert line.startswith("memory per device: about") and "(ddp, 1 process(es)) of 1.00 GiB on cpu" in line


def _rl_config(group_size: int, batch_size: int = 4, eval_samples: int = 8, **model):
    return config_from_dict({
        "model": {"n_layer": 2, "n_head": 2, "n_kv_head": 1, "n_embd": 64, "block_size": 128, **model},
        "data": {"format": "rl", "vocab_size": 512},
        "train": {"max_steps": 1, "batch_size": batch_size},
        "rl": {"group_size": group_size, "eval_samples": eval_samples},
    })


def _total_gib(line: str) -> float:
    return float(line.split("about ")[1].split(" GiB")[0])


@pytest.mark.parametrize("model", [{}, {"attention": "mla", "n_kv_head": 2, "kv_latent_dim": 16}],
                         ids=["gqa", "mla"])
def test_an_rl_estimate_counts_every_completion_of_a_group(monkeypatch, model):
    monkeypatch.setattr("training.memory_budget.device_memory_bytes", lambda device: 2**40)
    lines = {g: plan_run_memory(_rl_config(g, **model), torch.device("cpu"), world_size=1, micro_batch=4, bf16=False)
             for g in (2, 16, 64)}
    totals = [_total_gib(lines[g]) for g in (2, 16, 64)]
    assert totals[0] < totals[1] < totals[2]
    # The activations of a micro-batch are those of its 4 x G rows, as a text run of that batch has them.
    plain = estimate_memory(_rl_config(2, **model).model, TrainConfig(max_steps=1, batch_size=256), micro_batch=256)
    assert f"activations {plain.activations / 2**30:,.2f} GiB" in lines[64] and "sampling cache" in lines[64]


@pytest.mark.parametrize("options", [{"n_kv_head": 2}, {"attention": "mla", "kv_latent_dim": 8, "positions": "rope"}])
def test_the_sampling_cache_is_the_key_and_value_heads_of_every_layer_and_position(options):
    model = GPTConfig(**{**dict(vocab_size=256, block_size=64, n_layer=3, n_head=4, n_kv_head=4, n_embd=32), **options})
    cache = GPT(model).init_cache(10).nbytes()
    assert estimate_memory(model, TrainConfig(max_steps=1, batch_size=1), decoded_rows=10).sampling == cache


def _widest_fitting(gib: int, parallel: str, checkpointing: bool) -> str:
    """docs/training.md's cell: the widest of small.yaml's family (one layer and one head per 64 of
    width, a quarter as many key/value heads) whose estimate fits, at 4 x 512 tokens, bf16, AdamW."""
    train = TrainConfig(max_steps=1, batch_size=4, optimizer="adamw", parallel=parallel,
                        activation_checkpointing=checkpointing)
    best = None
    for width in range(256, 16384 + 1, 256):
        heads = width // 64
        config = GPTConfig(vocab_size=6400, block_size=512, n_layer=heads, n_head=heads, n_kv_head=heads // 4,
                           n_embd=width)
        world = 8 if parallel == "fsdp" else 1
        if estimate_memory(config, train, world_size=world, micro_batch=4, bf16=True).total > gib * 2**30:
            break
        best = config
    assert best is not None and best.n_embd < 16384  # the search found the edge, not its own ceiling
    return f"{best.num_params() / 1e6:,.0f}M ({best.n_layer} x {best.n_embd})"


def test_the_largest_models_in_the_training_guide_are_the_estimates():
    guide = (ROOT / "docs" / "training.md").read_text()
    for gib in (24, 80):
        cells = [_widest_fitting(gib, parallel, checkpointing)
                 for parallel in ("ddp", "fsdp") for checkpointing in (False, True)]
        assert f"| {gib} GiB | " + " | ".join(cells) + " |" in guide


# Two sizes (and the first with activation checkpointing): the estimate is within this fraction of
# the peak resident memory that two real steps added, measured in a fresh process.
MARGIN = 0.2
SIZES = [
    (dict(vocab_size=4096, block_size=256, n_layer=4, n_head=4, n_kv_head=2, n_embd=256),
     dict(max_steps=1, batch_size=8, optimizer="adamw")),
    (dict(vocab_size=2048, block_size=512, n_layer=8, n_head=6, n_kv_head=2, n_embd=384),
     dict(max_steps=1, batch_size=4, optimizer="muon")),
    (dict(vocab_size=2048, block_size=512, n_layer=8, n_head=6, n_kv_head=2, n_embd=384),
     dict(max_steps=1, batch_size=4, optimizer="muon", activation_checkpointing=True)),
]


@pytest.mark.e2e
@pytest.mark.parametrize(("model", "train"), SIZES)
def test_the_estimate_is_near_the_measured_peak_on_the_cpu(model, train):
    measured = _probe(model, train)
    estimate = estimate_memory(GPTConfig(**model), TrainConfig(**train)).total
    assert abs(estimate - measured) <= MARGIN * measured, (estimate / 2**20, measured / 2**20)


def _probe(model: dict, train: dict, parent_mib: int = 0) -> int:
    """What memory_probe.py measures training added; run from a parent holding ``parent_mib``."""
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    command = [sys.executable, str(ROOT / "tests" / "training" / "memory_probe.py"), json.dumps(model), json.dumps(train)]
    if parent_mib:  # the probe forked from a large process, as from a pytest that has run many tests
        command = [sys.executable, "-c", "import subprocess, sys\n"
                   f"held = bytearray({parent_mib} * 2**20)\n"
                   "for i in range(0, len(held), 4096): held[i] = 1\n"
                   "sys.exit(subprocess.run(sys.argv[1:]).returncode)", *command]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)["added"]


@pytest.mark.e2e
def test_the_probe_counts_its_own_training_not_the_parent_that_started_it():
    # Linux carries ru_maxrss across exec, so a probe reading it reported the parent's peak.
    model, train = SIZES[0]
    alone, under_a_large_parent = _probe(model, train), _probe(model, train, parent_mib=1024)
    assert abs(under_a_large_parent - alone) <= 0.1 * alone, (alone / 2**20, under_a_large_parent / 2**20)


# 1.5 TB of state; and a thousand million layers, which reached gigabytes before the size check ran.
@pytest.mark.parametrize("model, fix", [({"vocab_size": 100_000_000, "n_embd": 1024}, "lower model.vocab_size"),
                                        ({"n_layer": 1_000_000_000, "value_embeddings": True}, "model.n_layer")])
def test_a_model_too_large_for_the_machine_is_refused_before_building(make_config, model, fix):
    config = make_config(model=model)
    with pytest.raises(ConfigError, match=rf"GiB for weights, gradients and optimizer state.*{fix}"):
        train_run(config, progress=False)
    assert not (config.out_dir / "model.safetensors").exists()


def test_counting_a_deep_models_parameters_builds_nothing_per_layer(make_config):
    # The count once listed every value-embedding layer. It must cost the same at any depth.
    config = make_config().model.model_copy(update=dict(n_layer=1_000_000, value_embeddings=True))
    tracemalloc.start()
    try:
        params = config.num_params()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100_000 and params > 1_000_000 * 32 * 32
    assert len(config.value_embedding_layers) == 500_000 and 999_999 in config.value_embedding_layers

RL = {"group_size": 2, "max_new_tokens": 2, "eval_samples": 2,
      "arithmetic": {"train_problems": 20, "val_problems": 4, "max_operand": 9}}


def test_a_huge_operand_range_trains_without_listing_its_pairs(make_config, parent_run, tmp_path):
    # 10^8 pairs: the questions are drawn, never listed (longer operands would not fit this window).
    config = make_config(tmp_path / "run", data={"format": "rl"},
                         train={"init_from": str(parent_run), "max_steps": 1, "batch_size": 2},
                         eval={"interval": 0, "sample_tokens": 0, "final_max_batches": 1},
                         rl={**RL, "arithmetic": {**RL["arithmetic"], "max_operand": 9999}})
    assert train_run(config, progress=False).step == 1


def test_a_group_too_large_for_memory_is_refused_before_anything_is_allocated(make_config, parent_run, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr("training.memory_budget.device_memory_bytes", lambda device: 256 * 2**20)
    config = make_config(tmp_path / "run", data={"format": "rl"},
                         train={"init_from": str(parent_run), "batch_size": 64},
                         rl={**RL, "group_size": 1024})
    monkeypatch.setattr(rl_task, "prepare_arithmetic_prompts", lambda *a, **k: pytest.fail("prepared the questions"))
    with pytest.raises(ConfigError, match=r"this run would not fit: .*activations .* lower train.batch_size, "
                                          r"rl.group_size or rl.eval_samples") as error:
        train_run(config, progress=False)
    assert "\n" not in str(error.value) and not (config.out_dir / "model.safetensors").exists()
