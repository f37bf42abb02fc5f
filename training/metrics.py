"""What the metrics record measures: model FLOPs utilisation, throughput, and their formatting
(the metrics file itself is ``rundir.metrics``)."""

import json
import math
import os
import platform
import time
from collections import deque
from pathlib import Path

import torch

from common.files import atomic_write_text
from common.threads import STARVED_SHARE, starved_advice
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
    """Best achieved FLOP/s of an ``size x size`` matmul on ``device``: best-of, since the question is
    what the hardware can do, not what other processes left over this time."""
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


def peak_flops(setting: float | str, device: torch.device, dtype: torch.dtype,
               cache_file: Path | None = None) -> tuple[float, str]:
    """Peak FLOP/s of one device for MFU, and what that number is (the phrase a report prints)."""
    if not isinstance(setting, str):
        return float(setting), "train.peak_flops"
    if device.type == "cuda" and dtype == torch.bfloat16:
        known = known_gpu_peak(torch.cuda.get_device_name(device))
        if known is not None:
            return known, "the datasheet's dense bf16 peak"
    # The CPU (and unknown GPUs) get a short measurement: a datasheet number for "a CPU" does not
    # exist, and the measured matmul rate is the ceiling this model could reach anyway. Other
    # programs slow a measurement down, never up, and a peak measured low makes MFU read high, so
    # the best rate ever measured on this machine is the peak, kept in the user's cache folder.
    size = 1024 if device.type == "cpu" else 4096
    threads = torch.get_num_threads() if device.type == "cpu" else None
    cache_file = cache_file or peak_cache_file()
    best = best_peak(measure_matmul_flops(device, dtype, size=size), machine_key(device, dtype, threads), cache_file)
    where = f"{threads} thread{'s' if threads != 1 else ''}" if threads is not None else device_name(device)
    return best, f"the fastest {size}x{size} {str(dtype).removeprefix('torch.')} matmul measured here at {where}"


def peak_cache_file() -> Path:
    """Where measured peaks are kept: ``minigpt/peak_flops.json`` in $XDG_CACHE_HOME, else ~/.cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minigpt" / "peak_flops.json"


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model where Linux says it (else its architecture)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        model = ""
    return model or platform.processor() or platform.machine()


def machine_key(device: torch.device, dtype: torch.dtype, threads: int | None) -> str:
    """What a measured peak is the peak of: this host, its device, the dtype and (CPU) the threads."""
    key = f"{platform.node()} {device.type} {device_name(device)} {dtype}"
    return key if threads is None else f"{key} {threads} threads"


def best_peak(measured: float, key: str, cache_file: Path) -> float:
    """The best of ``measured`` and the peaks kept for ``key`` in ``cache_file``, which keeps it; a
    cache that cannot be read starts afresh, one that cannot be written is left as it is."""
    try:
        kept = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        kept = {}
    if not isinstance(kept, dict):
        kept = {}
    before = kept.get(key)
    if isinstance(before, (int, float)) and math.isfinite(before) and before >= measured:
        return float(before)
    kept[key] = measured
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache_file, json.dumps(kept, indent=1, sort_keys=True) + "\n")
    except OSError:
        pass
    return measured


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


class CpuShareWatch:
    """Notices, once, on a CPU, when other programs leave the training loop's thread on a core less
    than half the time, so the user knows why the run is slow. That thread runs the Python and its
    share of every operation, so on a quiet machine it is on a core nearly all the time."""

    def __init__(self, device: torch.device, threads: int) -> None:
        self.on_cpu, self.threads = device.type == "cpu", threads
        self.starved_share: float | None = None  # the share when it was noticed

    def advice(self, throughput: Throughput) -> str | None:
        """The one line to say when ``throughput``'s window shows the loop starved; None otherwise,
        and every time after the first."""
        if not self.on_cpu or self.starved_share is not None or not throughput.full:
            return None
        share = throughput.cpu_seconds_per_second()
        if share >= STARVED_SHARE:
            return None
        self.starved_share = share
        return starved_advice(share, self.threads)


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
