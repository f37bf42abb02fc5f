"""Where and how the model runs: the device, the autocast precision, TF32, the host allocator,
torch.compile."""

import contextlib
import ctypes
import os
import shutil
import sys
from typing import ContextManager

import torch

from common.errors import UserError


PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


def resolve_precision(preference: str, device: torch.device, run_own: str | None = None) -> torch.dtype:
    """The training step's autocast dtype: ``fp32`` or ``bf16`` as asked; ``auto`` picks bf16 on GPUs
    that support it and on CPUs with bf16 dot products, fp32 elsewhere, and keeps ``run_own``, a resumed
    run's precision, so a resume on another machine still ends on the uninterrupted run's weights.
    fp16 is absent: it needs loss scaling, and every GPU worth training on here has bf16."""
    if preference == "auto" and run_own is not None:
        preference, asked = run_own, f"train.precision=auto resumes the run's own {run_own}, but"
    else:
        asked = f"train.precision={preference} but"
    if preference == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError(f"{asked} this GPU has no bf16 support; use --set train.precision=fp32")
    if preference in PRECISIONS:
        return PRECISIONS[preference]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if device.type == "cpu" and cpu_has_bf16_dot_products():
        return torch.bfloat16
    return torch.float32


def precision_name(dtype: torch.dtype) -> str:
    """``bf16`` or ``fp32``: how configs, checkpoints and reports name an autocast dtype."""
    return next(name for name, value in PRECISIONS.items() if value == dtype)


def cpu_has_bf16_dot_products() -> bool:
    """Whether this CPU has AVX-512 BF16 or AMX, with which oneDNN (CPU autocast's matmuls) multiplies
    bf16 faster than fp32 (docs/training.md, Precision); without them bf16 buys only conversions.
    Asked of torch where it can say, else of the Linux kernel; elsewhere the answer is no."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)  # newer torch only
    if capabilities is not None:
        found = capabilities()
        return bool(found.get("avx512_bf16") or found.get("amx_bf16"))
    return not {"avx512_bf16", "amx_bf16"}.isdisjoint(linux_cpu_flags())


def linux_cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The ``flags`` of the first processor in /proc/cpuinfo (empty where there is none)."""
    try:
        with open(path, encoding="utf-8") as info:
            return next((set(line.split(":", 1)[1].split()) for line in info if line.startswith("flags")), set())
    except OSError:
        return set()


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
    """Ask glibc to keep freed memory for reuse; whether it accepted. A step frees and reallocates the
    same activation-sized blocks, which glibc would hand back to the kernel and fault in again page by
    page (docs/results.md); the cost is that the process keeps its peak resident size."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # Older glibc refuses mmap thresholds above 32 MiB; blocks larger than that still get mappings.
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


def should_compile(setting: bool | str, device: torch.device) -> bool:
    """``auto`` compiles on CUDA only: on the CPU a first compile costs more of a ten-minute budget than
    it wins back (docs/records.md). ``true`` compiles anywhere a C++ compiler is at hand; without one
    the run trains uncompiled and says so, rather than crash at its first step."""
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
