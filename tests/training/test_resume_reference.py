"""A post-training run measures itself against its parent's weights (DPO's rewards, GRPO's KL): resumed
after those weights changed, it is refused in one line, before anything is written, where its
reference is a frozen copy read from the parent's file. A LoRA run's reference comes from its own
checkpoint, and a GRPO run without a KL penalty has none: both resume."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from chat_testkit import preference_file
from model.io import load_pretrained, save_pretrained
from rundir.checkpoint import load_trainer_state
from training.init_from import InitFromError
from training.trainer import train


@pytest.fixture
def parent(parent_run, tmp_path) -> Path:  # a copy of the parent run, whose weights the test may change
    return Path(shutil.copytree(parent_run, tmp_path / "parent"))


def _post_training(kind: str, make_config, parent: Path, tmp_path: Path, max_steps: int):
    common = dict(eval={"interval": 0, "sample_tokens": 0, "final_max_batches": 1}, run={"checkpoint_interval": 1})
    train_section = {"init_from": str(parent), "max_steps": max_steps, "batch_size": 2, "warmup_steps": 0}
    if kind.startswith("dpo"):
        pairs = tmp_path / "pairs.jsonl"
        if not pairs.exists():
            preference_file(pairs, count=20)
        lora = {"lora": {"rank": 2}} if kind == "dpo-lora" else {}
        return make_config(tmp_path / "run", data={"format": "preference", "files": {"paths": [str(pairs)]}},
                           train={**train_section, **lora}, **common)
    beta = 0.0 if kind == "rl-no-kl" else 0.1
    return make_config(tmp_path / "run", data={"format": "rl"}, train=train_section,
                       rl={"group_size": 2, "max_new_tokens": 2, "eval_samples": 2, "beta": beta,
                           "arithmetic": {"train_problems": 20, "val_problems": 4, "max_operand": 9}}, **common)


def _change_weights(run: Path) -> None:
    model = load_pretrained(run)
    with torch.no_grad():
        next(model.parameters()).add_(0.01)
    save_pretrained(model, run)


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("kind", ["dpo", "rl-kl"])
def test_a_run_whose_reference_changed_is_refused_on_resume_and_left_as_it_was(kind, make_config, parent, tmp_path):
    train(_post_training(kind, make_config, parent, tmp_path, 1), progress=False)
    record = json.loads((tmp_path / "run" / "parent.json").read_text())
    assert record["weights_sha256"] == hashlib.sha256((parent / "model.safetensors").read_bytes()).hexdigest()
    before = _files(tmp_path / "run")
    _change_weights(parent)
    with pytest.raises(InitFromError) as error:
        train(_post_training(kind, make_config, parent, tmp_path, 2), resume=True, progress=False)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"cannot resume {tmp_path / 'run'}: its reference, "
                                                      f"{parent / 'model.safetensors'} (train.init_from), changed")
    assert "put the parent's weights back to resume" in message
    assert _files(tmp_path / "run") == before  # nothing written, nothing lost


@pytest.mark.parametrize("kind, put_back", [("dpo", True), ("rl-kl", True), ("dpo-lora", False), ("rl-no-kl", False)])
def test_a_run_resumes_when_its_reference_is_put_back_or_is_not_the_parents_file(kind, put_back, make_config, parent,
                                                                               tmp_path):
    train(_post_training(kind, make_config, parent, tmp_path, 1), progress=False)
    original = (parent / "model.safetensors").read_bytes()
    _change_weights(parent)
    if put_back:
        (parent / "model.safetensors").write_bytes(original)
    assert train(_post_training(kind, make_config, parent, tmp_path, 2), resume=True, progress=False).step == 2
    assert load_trainer_state(tmp_path / "run")["step"] == 2
