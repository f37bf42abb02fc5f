"""save_pretrained / load_pretrained: exact round trip, tied weights, and clear errors."""

import json

import pytest
import torch

from model.gpt import GPT
from model.io import MODEL_CONFIG_FILE, ModelFileError, WEIGHTS_FILE, load_pretrained, save_pretrained

IDX = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]])


class Wrapper(torch.nn.Module):  # stands in for DistributedDataParallel's .module
    def __init__(self, module):
        super().__init__()
        self.module = module


@pytest.mark.parametrize("tie, wrap", [(True, False), (False, True)], ids=["tied", "untied-wrapped"])
def test_round_trip_gives_identical_logits_and_tied_weights_stay_tied_through_a_training_step(make_model, tmp_path,
                                                                                               tie, wrap):
    model = make_model(seed=1, tie_embeddings=tie)
    save_pretrained(Wrapper(model) if wrap else model, tmp_path)  # a wrapped model is unwrapped
    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded, GPT) and not loaded.training
    assert loaded.config == model.config
    with torch.inference_mode():
        assert torch.equal(loaded(IDX), model(IDX))
    assert {p.name for p in tmp_path.iterdir()} == {MODEL_CONFIG_FILE, WEIGHTS_FILE}  # no temp files
    loaded.train()
    loaded(IDX, IDX)[1].backward()
    with torch.no_grad():
        loaded.tok_emb.weight.add_(1.0)
    assert torch.equal(loaded.lm_head.weight, loaded.tok_emb.weight) == tie


def _flipped(data: bytes) -> bytes:
    data = bytearray(data)
    data[-10] ^= 0xFF  # inside the last tensor, not the header
    return bytes(data)


def _config_with(**changes):
    return lambda data: json.dumps({**json.loads(data), **changes}).encode()


# Each file damaged (None: deleted), and the part of the one-line message loading must give.
LOAD_REFUSALS = {
    "weights-missing": (WEIGHTS_FILE, None, f"{WEIGHTS_FILE} is missing"),
    "weights-truncated": (WEIGHTS_FILE, lambda data: data[: len(data) // 2], "corrupt or truncated"),
    "weights-garbage": (WEIGHTS_FILE, lambda data: b"not a safetensors file at all", "corrupt or truncated"),
    "weights-flipped-byte": (WEIGHTS_FILE, _flipped, "do not match the checksum"),
    "config-missing": (MODEL_CONFIG_FILE, None, f"{MODEL_CONFIG_FILE} is missing"),
    "config-not-json": (MODEL_CONFIG_FILE, lambda data: b"{ not json", "not valid JSON"),
    "config-invalid": (MODEL_CONFIG_FILE, _config_with(n_head=5),
                       "holds an invalid model config: model: n_embd (42) must be divisible by n_head (5)"),
    "more-tokens": (MODEL_CONFIG_FILE, _config_with(vocab_size=98),
                    "tok_emb.weight has shape (97, 42) in the file but (98, 42)"),
    "more-layers": (MODEL_CONFIG_FILE, _config_with(n_layer=3), "missing ['blocks.2."),
    # a position table of 168 GB, never built
    "huge-table": (MODEL_CONFIG_FILE, _config_with(block_size=1_000_000_000), "pos_emb.weight has shape"),
}


@pytest.mark.parametrize("name, damage, fragment", LOAD_REFUSALS.values(), ids=LOAD_REFUSALS)
def test_a_missing_or_damaged_file_is_one_line(make_model, tmp_path, name, damage, fragment):
    with pytest.raises(ValueError) as info:  # a ModelFileError, which is a ValueError
        load_pretrained(tmp_path / "nope")
    assert "does not exist" in str(info.value)
    save_pretrained(make_model(seed=4), tmp_path)
    path = tmp_path / name
    if damage:
        path.write_bytes(damage(path.read_bytes()))
    else:
        path.unlink()
    with pytest.raises(ValueError) as info:
        load_pretrained(tmp_path)
    message = str(info.value)
    assert fragment in message and "\n" not in message and isinstance(info.value, ModelFileError)
