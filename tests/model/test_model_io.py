"""save_pretrained / load_pretrained: exact round trip, tied weights, and clear errors."""

import json

import pytest
import torch

from model.gpt import GPT
from model.io import MODEL_CONFIG_FILE, ModelFileError, WEIGHTS_FILE, load_pretrained, save_pretrained

IDX = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]])


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_gives_identical_logits(make_model, tmp_path, tie):
    model = make_model(seed=1, tie_embeddings=tie)
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded, GPT) and not loaded.training
    assert loaded.config == model.config
    with torch.inference_mode():
        assert torch.equal(loaded(IDX), model(IDX))
    assert (loaded.lm_head.weight is loaded.tok_emb.weight) == tie
    assert {p.name for p in tmp_path.iterdir()} == {MODEL_CONFIG_FILE, WEIGHTS_FILE}  # no temp files


def test_tied_weights_stay_tied_after_load_and_training_step(make_model, tmp_path):
    save_pretrained(make_model(seed=2), tmp_path)
    loaded = load_pretrained(tmp_path)
    loaded.train()
    _, loss = loaded(IDX, IDX)
    loss.backward()
    with torch.no_grad():
        loaded.tok_emb.weight.add_(1.0)
    assert torch.equal(loaded.lm_head.weight, loaded.tok_emb.weight)


def test_wrapped_model_is_unwrapped(make_model, tmp_path):
    class Wrapper(torch.nn.Module):  # stands in for DistributedDataParallel's .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    model = make_model(seed=3)
    save_pretrained(Wrapper(model), tmp_path)
    with torch.inference_mode():
        assert torch.equal(load_pretrained(tmp_path)(IDX), model(IDX))


@pytest.fixture
def saved(make_model, tmp_path):
    save_pretrained(make_model(seed=4), tmp_path)
    return tmp_path


def load_error(directory) -> str:
    with pytest.raises(ValueError) as info:  # a ModelFileError, which is a ValueError
        load_pretrained(directory)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, ModelFileError)
    return message


def test_missing_directory_and_files(saved, tmp_path):
    assert "does not exist" in load_error(tmp_path / "nope")
    (saved / WEIGHTS_FILE).unlink()
    assert f"{WEIGHTS_FILE} is missing" in load_error(saved)
    (saved / MODEL_CONFIG_FILE).unlink()
    assert f"{MODEL_CONFIG_FILE} is missing" in load_error(saved)


def _flipped(data: bytes) -> bytes:
    data = bytearray(data)
    data[-10] ^= 0xFF  # inside the last tensor, not the header
    return bytes(data)


@pytest.mark.parametrize("damage, fragment", [
    (lambda data: data[: len(data) // 2], "corrupt or truncated"),
    (lambda data: b"not a safetensors file at all", "corrupt or truncated"),
    (_flipped, "do not match the checksum"),
], ids=["truncated", "garbage", "flipped-byte"])
def test_damaged_weights(saved, damage, fragment):
    path = saved / WEIGHTS_FILE
    path.write_bytes(damage(path.read_bytes()))
    assert fragment in load_error(saved)


def test_corrupt_or_invalid_config(saved):
    path = saved / MODEL_CONFIG_FILE
    original = json.loads(path.read_text())
    path.write_text("{ not json")
    assert "not valid JSON" in load_error(saved)
    path.write_text(json.dumps({**original, "n_head": 5}))
    assert "invalid model config" in load_error(saved) and "n_embd" in load_error(saved)


def test_weights_that_do_not_fit_the_config(saved):
    path = saved / MODEL_CONFIG_FILE
    original = json.loads(path.read_text())
    path.write_text(json.dumps({**original, "vocab_size": original["vocab_size"] + 1}))
    assert "tok_emb.weight has shape (97, 42) in the file but (98, 42)" in load_error(saved)
    path.write_text(json.dumps({**original, "n_layer": 3}))
    assert "missing ['blocks.2." in load_error(saved)
    path.write_text(json.dumps({**original, "block_size": 1_000_000_000}))  # a position table of 168 GB, never built
    assert "pos_emb.weight has shape" in load_error(saved)
