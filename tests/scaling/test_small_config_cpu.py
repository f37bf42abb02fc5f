"""configs/small.yaml's GPU path (bf16 autocast, torch.compile, its options) for a few steps of a shrunk
model on the CPU, so that a change breaking the GPU config fails here first."""

import math
import shutil

import pytest

from model.io import load_pretrained
from rundir.checkpoint import load_trainer_state
from training.trainer import train


@pytest.mark.e2e
@pytest.mark.skipif(not any(shutil.which(c) for c in ("c++", "g++", "clang++")), reason="torch.compile needs a C++ compiler")
def test_small_yaml_trains_compiled_in_bf16_on_the_cpu(small_config, capsys):
    config = small_config("train.precision=bf16", "train.compile=true", "train.max_steps=3", "eval.interval=0",
                          "eval.sample_tokens=0", "logging.wandb.mode=disabled")
    assert config.model.value_embeddings and config.train.optimizer == "adamw" and config.train.grad_accum_steps == 2
    result = train(config, progress=True)
    out = capsys.readouterr().out
    assert "(bf16, compiled)" in out and "memory per device: about" in out
    assert result.step == 3 and math.isfinite(result.val_loss) and math.isfinite(result.last_loss)
    assert load_trainer_state(result.run_dir)["step"] == 3
    assert load_pretrained(result.run_dir).config.value_embeddings  # the saved model loads
