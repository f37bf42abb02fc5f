"""Which device to run on, and how much memory it has: one picker for every command (``train.device``,
``--device``), so all accept the same names and fail with the same kind of message."""

import os

import torch

from common.errors import UserError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"


def select_device(name: str = "auto", *, setting: str = "device") -> torch.device:
    """``auto`` picks CUDA, then Apple's MPS, then the CPU; an explicit device must exist here.
    ``setting`` is how the user spelled the option (``train.device``, ``--device``), for the message."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):  # torch rejects names it does not know, e.g. "tpu"
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"unknown device {name!r} for {setting}; use {DEVICE_CHOICES}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{setting} is {name!r} but CUDA is not available here; use auto or cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(
                f"{setting} is {name!r} but only {torch.cuda.device_count()} CUDA device(s) exist here"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"{setting} is {name!r} but MPS is not available here; use auto or cpu")
    return device


def device_memory_bytes(device: torch.device) -> int | None:
    """Total memory of ``device`` (physical RAM for the CPU); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None
