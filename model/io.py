"""Saving and loading a model as a self-describing directory: model_config.json + model.safetensors.

safetensors holds raw tensors and no code, so loading a downloaded checkpoint cannot execute
anything. A SHA-256 of the tensors is stored in the file's metadata: the format itself detects a
truncated file, but not flipped bytes inside the tensor data."""

import hashlib
import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from common.errors import one_line
from common.files import atomic_output, atomic_write_text
from model.config import GPTConfig
from model.gpt import GPT, unwrap

MODEL_CONFIG_FILE = "model_config.json"
WEIGHTS_FILE = "model.safetensors"
_DIGEST_KEY = "tensors_sha256"


class ModelFileError(ValueError):
    """A model directory that cannot be loaded: missing, corrupt or inconsistent files."""


def save_pretrained(model: nn.Module, directory: str | os.PathLike) -> None:
    """Write the model's config and weights into ``directory`` (created if needed), atomically. A tied
    LM head shares the token embedding's tensor, so only the embedding is stored and the tie is rebuilt on load."""
    model = unwrap(model)
    if not isinstance(model, GPT):
        raise TypeError(f"save_pretrained expects a GPT (possibly wrapped), got {type(model).__name__}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to("cpu").contiguous() for name, t in _stored_state(model).items()}
    metadata = {"format": "pt", _DIGEST_KEY: _digest(state)}
    with atomic_output(directory / WEIGHTS_FILE) as tmp:
        try:
            save_file(state, str(tmp), metadata=metadata)
        except SafetensorError as e:
            raise _as_os_error(e, directory / WEIGHTS_FILE) from None
    # The config goes last: a directory whose save was interrupted fails to load loudly.
    atomic_write_text(directory / MODEL_CONFIG_FILE, json.dumps(model.config.to_dict(), indent=2) + "\n")


def load_pretrained(directory: str | os.PathLike, device: torch.device | str = "cpu") -> GPT:
    """Rebuild the model saved in ``directory``, on ``device``, in eval mode; ModelFileError if it cannot."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelFileError(f"model directory {directory} does not exist; "
                             f"pass a directory written by save_pretrained")
    config = _read_config(directory / MODEL_CONFIG_FILE)
    state = _read_weights(directory / WEIGHTS_FILE)
    # Shapes first, on the meta device (nothing allocated): a config claiming an absurd size
    # must not allocate it before the file proves otherwise.
    with torch.device("meta"):
        skeleton = GPT(config)
    _check_matches(state, _stored_state(skeleton), directory)
    model = GPT(config)
    model.load_state_dict(state, strict=False)  # strict would ask for the tied head's second name
    return model.to(device).eval()


def load_model_config(directory: str | os.PathLike) -> GPTConfig:
    """The config saved in ``directory``, without reading the weights; ModelFileError as
    ``load_pretrained`` raises it."""
    return _read_config(Path(directory) / MODEL_CONFIG_FILE)


def _read_config(path: Path) -> GPTConfig:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFileError(f"{path} is missing; the directory was not written by save_pretrained, "
                             f"or its save was interrupted") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{path} is unreadable or not valid JSON ({one_line(e)}); "
                             f"restore it or save the model again") from None
    try:
        return GPTConfig.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise ModelFileError(f"{path} holds an invalid model config: {one_line(e)}") from None


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelFileError(f"{path} is missing; the directory was not written by save_pretrained, "
                             f"or its save was interrupted")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            state = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise ModelFileError(f"{path} is corrupt or truncated ({one_line(e)}); "
                             f"restore it or save the model again") from None
    expected = metadata.get(_DIGEST_KEY)
    if expected is not None and expected != _digest(state):
        raise ModelFileError(f"{path} is corrupt: its tensors do not match the checksum stored when it "
                             f"was saved; restore it or save the model again")
    return state


def _check_matches(state: dict[str, torch.Tensor], wanted: dict[str, torch.Tensor], directory: Path) -> None:
    missing = sorted(set(wanted) - set(state))
    unexpected = sorted(set(state) - set(wanted))
    if missing or unexpected:
        raise ModelFileError(
            f"{directory / WEIGHTS_FILE} does not match {directory / MODEL_CONFIG_FILE}: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}; save config and weights together"
        )
    for name, tensor in wanted.items():
        if state[name].shape != tensor.shape:
            raise ModelFileError(
                f"{directory / WEIGHTS_FILE} does not match {directory / MODEL_CONFIG_FILE}: {name} has shape "
                f"{tuple(state[name].shape)} in the file but {tuple(tensor.shape)} in the config"
            )


def _stored_state(model: GPT) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    if model.config.tie_embeddings:
        del state["lm_head.weight"]  # same tensor as tok_emb.weight
    return state


def _digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def _as_os_error(error: Exception, path: Path) -> Exception:
    """safetensors reports a failed write (a full disk) as text; recover the OSError it was."""
    found = re.search(r"os error (\d+)", str(error))
    if found is None:
        return error
    code = int(found.group(1))
    return OSError(code, os.strerror(code), str(path))
