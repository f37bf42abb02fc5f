"""How many CPU threads a command gives torch, and how its idle threads wait.

Two things make a PyTorch command collapse on a machine that is doing other work:

- **Spinning workers.** PyTorch's CPU wheel parallelises with GNU OpenMP, whose idle workers spin
  on a core between parallel regions by default. When other programs want that core, the spinning
  worker and the program take turns, and every small operation (a decode step is hundreds of them)
  waits for a worker the scheduler has parked. ``calm_openmp_workers`` asks OpenMP to sleep instead.
  OpenMP reads the setting once, when torch's library loads, so the entry scripts call it before
  they import anything that imports torch.
- **More threads than free cores.** torch starts one thread per core, whatever else runs there.
  ``choose_threads`` gives ``auto`` the cores this process may use minus the share the rest of the
  machine keeps busy (the one-minute load average), and never fewer than one.

Every command that runs the model takes ``--threads N|auto`` (``train.threads`` in a config) and
goes through ``use_threads``. An explicit number is the user's call and is never second-guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from common.errors import UserError

AUTO = "auto"
# Below this share of the time on a core, a command's working thread is starved by other programs:
# far slower than the machine can go, not merely noisy.
STARVED_SHARE = 0.5


def calm_openmp_workers() -> None:
    """Make OpenMP's idle workers sleep rather than spin, unless the user chose a wait policy.

    Effective only before torch is first imported in this process.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    usable_cpus: int  # the CPUs this process may run on
    others_load: float | None  # the rest of the machine's load on those CPUs; None: not read
    source: str  # auto, or the setting that fixed the number (--threads, train.threads, OMP_NUM_THREADS)

    def describe(self) -> str:
        """One phrase for a command's start-up line, e.g. ``1 thread (auto: 2 CPUs, 1.3 busy)``."""
        plural = "thread" if self.threads == 1 else "threads"
        if self.source != AUTO:
            return f"{self.threads} {plural} ({self.source})"
        busy = "" if self.others_load is None else f", {self.others_load:.1f} busy"
        return f"{self.threads} {plural} (auto: {self.usable_cpus} CPUs{busy})"


def parse_threads(value: object, setting: str = "--threads") -> int | None:
    """``auto`` (None) or a whole number of threads >= 1; anything else is a UserError."""
    if value is None or value == AUTO:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{setting} must be auto or a whole number of threads >= 1, got {value!r}")
    return value


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def others_load(cpus: int) -> float | None:
    """How many of ``cpus`` the rest of the machine keeps busy, from the one-minute load average.

    The load average counts runnable tasks on every CPU of the machine, so it is scaled to this
    process's share of them. A command just starting adds little to a one-minute average.
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    total = max(cpus, os.cpu_count() or cpus)
    return load * cpus / total


def choose_threads(requested: int | None, cpus: int, load: float | None, setting: str = "--threads") -> ThreadChoice:
    """The threads to use: ``requested`` as given, or for ``auto`` the ``cpus`` that ``load`` leaves free."""
    if requested is not None:
        return ThreadChoice(requested, cpus, None, setting)
    free = cpus if load is None else round(cpus - load)
    return ThreadChoice(min(cpus, max(1, free)), cpus, load, AUTO)


def use_threads(requested: int | None, setting: str = "--threads") -> ThreadChoice:
    """Choose the thread count for ``requested`` (None = auto) on this machine and give it to torch.

    ``auto`` keeps an OMP_NUM_THREADS the environment sets: the user's, or torchrun's one thread
    per process when several share a machine.
    """
    import torch  # here, not at import: the entry scripts import this module before torch on purpose

    cpus = usable_cpus()
    from_env = _omp_num_threads()
    if requested is None and from_env is not None:
        choice = choose_threads(from_env, cpus, None, "OMP_NUM_THREADS")
    else:
        choice = choose_threads(requested, cpus, None if requested is not None else others_load(cpus), setting)
    torch.set_num_threads(choice.threads)
    return choice


def _omp_num_threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def starved_advice(share: float, threads: int) -> str:
    """The one line a command prints when other programs keep it off the CPU (``share``: the
    fraction of the time its working thread was on a core)."""
    fix = ("close what else is running, or run it when the machine is quieter" if threads == 1
           else "try --threads 1, or close what else is running")
    return (f"note: other programs are using this machine's cores (this command was on a CPU {100 * share:.0f}% "
            f"of the time), so it runs slower than the machine can; {fix}")


def add_threads_argument(parser, default: str = AUTO, why: str = "") -> None:
    """The ``--threads`` flag every command that runs the model shares."""
    parser.add_argument(
        "--threads", default=default, metavar="N|auto",
        help=f"CPU threads for the model (default: {default}: the CPUs this process may use, less those "
        f"other programs keep busy{why})",
    )
