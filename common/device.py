"""Which device to run on: one picker shared by train.py (``train.device``) and generate.py
(``--device``), so both accept the same names and fail with the same kind of message."""

from __future__ import annotations

import torch

from common.errors import UserError

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"


def select_device(name: str = "auto", *, setting: str = "device") -> torch.device:
    """``auto`` picks CUDA, then Apple's MPS, then the CPU; an explicit device must exist here.

    ``setting`` is how the user spelled the option (``train.device``, ``--device``), so the
    message points at the thing to change.
    """
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
