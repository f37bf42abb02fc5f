"""What the metrics record measures: model FLOPs utilisation, throughput, and their formatting
(the metrics file itself is ``rundir.metrics``)."""

from __future__ import annotations

import math
import time
from collections import deque

import torch

from training.device import synchronize


# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' datasheets, matched by substring of
# torch.cuda.get_device_name(); more specific names come first. Anything else is measured.
_GPU_BF16_PEAKS: list[tuple[str, float]] = [
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
]


def known_gpu_peak(name: str) -> float | None:
    return next((peak for key, peak in _GPU_BF16_PEAKS if key in name), None)


def measure_matmul_flops(
    device: torch.device, dtype: torch.dtype = torch.float32, size: int = 1024, max_seconds: float = 0.5
) -> float:
    """Best achieved FLOP/s of an ``size x size`` matmul on ``device`` (the practical peak).

    Best-of rather than mean: the question is what the hardware can do, not what the other
    processes sharing it left over this time.
    """
    # A private generator: measuring must not move the global RNG that seeds the model.
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=gen)
    torch.matmul(a, b)  # first call pays for library initialisation
    synchronize(device)
    best = math.inf
    start = time.perf_counter()
    for _ in range(50):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > max_seconds:
            break
    return 2.0 * size**3 / best


def peak_flops(setting: float | str, device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """Peak FLOP/s of one device for MFU, and where the number came from."""
    if not isinstance(setting, str):
        return float(setting), "config"
    if device.type == "cuda" and dtype == torch.bfloat16:
        known = known_gpu_peak(torch.cuda.get_device_name(device))
        if known is not None:
            return known, "datasheet"
    # The CPU (and unknown GPUs) get a short measurement: a datasheet number for "a CPU" does not
    # exist, and the measured matmul rate is the ceiling this model could reach anyway.
    size = 1024 if device.type == "cpu" else 4096
    return measure_matmul_flops(device, dtype, size=size), "measured"


def mfu(flops_per_token: float, tokens_per_second: float, peak: float) -> float:
    """Model FLOPs utilisation: the fraction of peak that the model's own arithmetic uses."""
    return flops_per_token * tokens_per_second / peak if peak > 0 else 0.0


class Throughput:
    """Tokens per second over a window of recent steps (startup and evaluations excluded), and
    the CPU time the loop's thread got in those steps."""

    def __init__(self, window: int = 20) -> None:
        self._samples: deque[tuple[int, float, float]] = deque(maxlen=window)

    def add(self, tokens: int, seconds: float, cpu_seconds: float = 0.0) -> None:
        self._samples.append((tokens, seconds, cpu_seconds))

    @property
    def full(self) -> bool:
        return len(self._samples) == self._samples.maxlen

    def tokens_per_second(self) -> float:
        seconds = self._seconds()
        return sum(t for t, _, _ in self._samples) / seconds if seconds > 0 else 0.0

    def seconds_per_step(self) -> float:
        return self._seconds() / len(self._samples) if self._samples else 0.0

    def cpu_seconds_per_second(self) -> float:
        """CPU seconds per wall second over the window, of whatever clock ``add`` was given."""
        seconds = self._seconds()
        return sum(c for _, _, c in self._samples) / seconds if seconds > 0 else 0.0

    def _seconds(self) -> float:
        return sum(s for _, s, _ in self._samples)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_flops(value: float) -> str:
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"
