"""Where and how the model runs: the device, the autocast precision, TF32, the host allocator,
torch.compile."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import sys
from typing import ContextManager

import torch

from common.errors import UserError


def resolve_precision(preference: str, device: torch.device) -> torch.dtype:
    """The autocast dtype: bf16 on GPUs that support it (auto), fp32 otherwise.

    fp16 is deliberately absent: it needs loss scaling, and every GPU worth training on here has
    bf16. On the CPU bf16 autocast works but is slower than fp32 for small matmuls, so auto keeps
    fp32 there.
    """
    if preference == "fp32":
        return torch.float32
    if preference == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise UserError("train.precision=bf16 but this GPU has no bf16 support; use fp32")
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype) -> ContextManager:
    """Mixed precision for forward passes; a no-op context in fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def configure_backends(device: torch.device) -> None:
    """Allow TF32 for fp32 matmuls on CUDA (much faster on Ampere and later, at a precision that
    does not matter for training); on the CPU, keep freed memory for reuse."""
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
    elif device.type == "cpu":
        keep_freed_memory()


# mallopt parameter numbers, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of handing it back to the kernel.

    A training step frees and reallocates the same activation-sized blocks every time; by default
    glibc hands them back to the kernel, so every step faults its memory back in page by page
    (docs/results.md). Raising both thresholds lets the blocks be reused; the cost is that the
    process keeps its peak resident size. Returns whether glibc accepted the settings.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # Older glibc refuses mmap thresholds above 32 MiB; blocks larger than that still get mappings.
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def should_compile(setting: bool | str, device: torch.device) -> bool:
    """``auto`` compiles on CUDA only; ``true`` compiles anywhere a compiler is at hand.

    On the CPU a machine's first compile costs more of a ten-minute budget than its faster steps win
    back, and with Inductor's on-disk cache warm they only tie (docs/records.md), so ``auto`` leaves
    it off there. Inductor builds CPU kernels with a C++ compiler; without one a compiled run would
    crash at its first step, so it trains uncompiled and says so instead.
    """
    wanted = setting if isinstance(setting, bool) else device.type == "cuda"
    compilers = [os.environ.get("CXX", ""), "c++", "g++", "clang++"]
    if wanted and device.type == "cpu" and not any(name and shutil.which(name) for name in compilers):
        print(
            "warning: train.compile is on but no C++ compiler (c++, g++ or clang++; or $CXX) was found, "
            "which torch.compile needs on the CPU; training uncompiled",
            file=sys.stderr,
        )
        return False
    return wanted


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so wall-clock timings cover the work they claim to."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
