"""The trainer state beside the saved model, and the rules that keep a new run from clobbering another."""

import pytest
import torch

from model.config import GPTConfig
from model.gpt import GPT
from model.io import load_pretrained
from rundir.checkpoint import (CheckpointError, check_run_dir, clear_old_run, load_trainer_state, peek_trainer_state,
    save_checkpoint)
from rundir.files import STATE_FILE

SHAPE = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_kv_head=1, n_embd=32)


def test_a_checkpoint_round_trip_gives_back_the_state_and_the_model(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE))
    state = {"step": 7, "model": model.state_dict(), "ranks": [{"rng": torch.get_rng_state()}], "wandb_run_id": "abc"}
    save_checkpoint(tmp_path, model, state)

    loaded = load_trainer_state(tmp_path)
    assert loaded["format_version"] == 1 and loaded["step"] == 7 and loaded["wandb_run_id"] == "abc"
    assert torch.equal(loaded["ranks"][0]["rng"], state["ranks"][0]["rng"])
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded["model"][name], tensor), name
    # The model files beside it are what generate.py loads.
    assert torch.equal(load_pretrained(tmp_path).tok_emb.weight, model.tok_emb.weight)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    peek = tmp_path / "peek"  # peeking reads one value and never fails
    assert peek_trainer_state(peek, "wandb_run_id") is None  # no state at all
    model = GPT(GPTConfig(**SHAPE))
    save_checkpoint(peek, model, {"wandb_run_id": "abc"})
    assert peek_trainer_state(peek, "wandb_run_id") == "abc"
    assert peek_trainer_state(peek, "missing") is None
    (peek / STATE_FILE).write_bytes(b"damaged")
    assert peek_trainer_state(peek, "wandb_run_id") is None


class Evil:
    """Any class: unpickling it would run arbitrary code, so weights_only refuses it."""

@pytest.mark.parametrize("saved, message", [
    (b"not a checkpoint", "cannot be read"),
    ({"format_version": 1, "thing": Evil()}, "not loaded"),
    ({"format_version": 99}, "unknown format"),
], ids=["unreadable", "pickled-object", "other-format"])
def test_a_checkpoint_that_cannot_be_trusted_is_refused(tmp_path, saved, message):
    if isinstance(saved, bytes):
        (tmp_path / STATE_FILE).write_bytes(saved)
    else:
        torch.save(saved, tmp_path / STATE_FILE)
    with pytest.raises(CheckpointError, match=message) as refused:
        load_trainer_state(tmp_path)
    assert "weights_only=False" not in str(refused.value)  # never advise running the file's code


def test_run_dir_rules(tmp_path):
    check_run_dir(tmp_path / "new", resume=False, overwrite=False)  # a new directory is fine
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not empty"):
        check_run_dir(other, resume=False, overwrite=False)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="already holds a run"):
        check_run_dir(run, resume=False, overwrite=False)
    check_run_dir(run, resume=False, overwrite=True)
    # Checking never deletes: the old run goes only when the trainer clears it.
    assert (run / "metrics.jsonl").exists()
    clear_old_run(run)
    # Overwriting removes the run's own files only.
    assert not (run / "metrics.jsonl").exists() and (run / "notes.txt").read_text() == "keep me"
    with pytest.raises(CheckpointError, match="no checkpoint"):
        check_run_dir(run, resume=True, overwrite=False)
