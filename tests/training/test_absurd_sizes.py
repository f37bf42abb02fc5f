"""Absurd sizes are refused before anything is allocated (a model_config.json claiming a billion positions:
tests/model/test_model_io.py)."""

import tracemalloc

import pytest

import training.tasks.grpo.task as rl_task
from training.config import ConfigError
from training.trainer import train


# 1.5 TB of state; and a thousand million layers, which reached gigabytes before the size check ran.
@pytest.mark.parametrize("model, fix", [({"vocab_size": 100_000_000, "n_embd": 1024}, "lower model.vocab_size"),
                                        ({"n_layer": 1_000_000_000, "value_embeddings": True}, "model.n_layer")])
def test_a_model_too_large_for_the_machine_is_refused_before_building(make_config, model, fix):
    config = make_config(model=model)
    with pytest.raises(ConfigError, match=rf"GiB for weights, gradients and optimizer state.*{fix}"):
        train(config, progress=False)
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

# Post-training: sizes and weights of the dpo: and rl: sections


RL = {"group_size": 2, "max_new_tokens": 2, "eval_samples": 2,
      "arithmetic": {"train_problems": 20, "val_problems": 4, "max_operand": 9}}


def test_a_huge_operand_range_trains_without_listing_its_pairs(make_config, parent_run, tmp_path):
    # 10^8 pairs: the questions are drawn, never listed (longer operands would not fit this window).
    config = make_config(tmp_path / "run", data={"format": "rl"},
                         train={"init_from": str(parent_run), "max_steps": 1, "batch_size": 2},
                         eval={"interval": 0, "sample_tokens": 0, "final_max_batches": 1},
                         rl={**RL, "arithmetic": {**RL["arithmetic"], "max_operand": 9999}})
    assert train(config, progress=False).step == 1


def test_a_group_too_large_for_memory_is_refused_before_anything_is_allocated(make_config, parent_run, tmp_path,
                                                                              monkeypatch):
    monkeypatch.setattr("training.memory_budget.device_memory_bytes", lambda device: 256 * 2**20)
    config = make_config(tmp_path / "run", data={"format": "rl"},
                         train={"init_from": str(parent_run), "batch_size": 64},
                         rl={**RL, "group_size": 1024})
    monkeypatch.setattr(rl_task, "prepare_arithmetic_prompts", lambda *a, **k: pytest.fail("prepared the questions"))
    with pytest.raises(ConfigError, match=r"this run would not fit: .*activations .* lower train.batch_size, "
                                          r"rl.group_size or rl.eval_samples") as error:
        train(config, progress=False)
    assert "\n" not in str(error.value) and not (config.out_dir / "model.safetensors").exists()
