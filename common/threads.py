"""How many CPU threads a command gives torch, and how its idle threads wait.

Two things make a PyTorch command collapse on a machine that is doing other work:

- **More threads than free cores.** torch starts one thread per core, whatever else runs there.
  ``choose_threads`` gives ``auto`` the cores this process may use minus those the rest of the
  machine keeps busy (sampled for a tenth of a second at start), and never fewer than one; a single
  decoding stream takes one thread, since its operations are too small to share between cores.
- **Spinning workers.** PyTorch's CPU wheel parallelises with GNU OpenMP, whose idle workers spin
  on a core between parallel regions. When other programs want that core, the spinning worker and
  the program take turns, and every small operation waits for a worker the scheduler has parked.
  ``calm_openmp_workers`` shortens the spin tenfold. Sleeping at once (``OMP_WAIT_POLICY=PASSIVE``)
  would help more beside other work but costs a quiet machine dearly, since every operation then
  wakes its workers. OpenMP reads the setting once, when torch's library loads, so the entry
  scripts call it before they import anything that imports torch."""

import argparse
import os
import time
from dataclasses import dataclass

from common.cli import whole_number
from common.errors import UserError

AUTO = "auto"
# Below this share of the time on a core, a command's working thread is starved by other programs:
# far slower than the machine can go, not merely noisy.
STARVED_SHARE = 0.5


# GNU OpenMP's spin before an idle worker sleeps, in iterations: a tenth of its default, which
# costs a quiet machine nothing measurable (docs/results.md).
WORKER_SPIN = "30000"


def calm_openmp_workers() -> None:
    """Shorten how long OpenMP's idle workers spin, unless the user set a wait policy or spin."""
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", WORKER_SPIN)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    usable_cpus: int  # the CPUs this process may run on
    others_busy: float | None  # how many of those CPUs other programs kept busy; None: not read
    source: str  # auto, or the setting that fixed the number (--threads, train.threads, OMP_NUM_THREADS)

    def describe(self) -> str:
        """One phrase for a command's start-up line, e.g. ``1 thread (auto: 2 CPUs, 1.3 busy)``."""
        plural = "thread" if self.threads == 1 else "threads"
        if self.source != AUTO:
            return f"{self.threads} {plural} ({self.source})"
        busy = "" if self.others_busy is None else f", {self.others_busy:.1f} busy"
        return f"{self.threads} {plural} (auto: {self.usable_cpus} CPUs{busy})"


def parse_threads(value: object, setting: str = "--threads", cpus: int | None = None) -> int | None:
    """``auto`` (None) or a whole number of threads from 1 to the machine's ``cpus`` (default: all
    of them); anything else is a UserError."""
    if value is None or value == AUTO:
        return None
    number = whole_number(value) if isinstance(value, str) else value
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise UserError(f"{setting} must be auto or a whole number of threads >= 1, got {value!r}")
    return check_thread_count(number, setting, cpus)


def check_thread_count(threads: int, setting: str, cpus: int | None = None) -> int:
    """``threads`` if this machine has that many CPUs. More only queue for the same cores, and
    OpenMP sizes its pool by the count: a thousand million threads exhausts memory at once."""
    cpus = cpus or os.cpu_count() or 1
    if threads > cpus:
        fix = "or unset it" if setting == "OMP_NUM_THREADS" else "or auto"
        raise UserError(f"{setting} asks for {threads} threads, more than the {cpus} CPUs of this machine; "
                        f"give at most {cpus}, {fix}")
    return threads


def thread_count(text: str) -> int:
    """An argparse ``type`` for a benchmark's ``--threads N``: a count from 1 to the machine's CPUs."""
    threads, cpus = whole_number(text), os.cpu_count() or 1
    if threads is None or not 1 <= threads <= cpus:
        raise argparse.ArgumentTypeError(f"must be a whole number of threads from 1 to this machine's {cpus} CPUs, "
                                         f"got {text!r}")
    return threads


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask, e.g. under taskset or a container's cpuset)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def busy_cpus(cpus: frozenset[int], seconds: float = 0.1) -> float | None:
    """How many of ``cpus`` other programs keep busy right now: their non-idle share over a short
    sample of the kernel's per-CPU counters (/proc/stat), taken while this process sleeps. A
    direct sample, not the load average: that one trails by a minute, so a command run right
    after another would count its predecessor as a neighbour. None where the counters cannot be read."""
    before = _cpu_counters(cpus)
    if before is None:
        return None
    time.sleep(seconds)
    after = _cpu_counters(cpus)
    if after is None:
        return None
    busy = 0.0
    for cpu, (total, idle) in after.items():
        elapsed = total - before[cpu][0]
        if elapsed > 0:
            busy += 1.0 - (idle - before[cpu][1]) / elapsed
    return busy


def _cpu_counters(cpus: frozenset[int]) -> dict[int, tuple[int, int]] | None:
    """Per CPU in ``cpus``: (all ticks, idle ticks, waiting for I/O included) since boot."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    counters = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            counters[int(name[3:])] = (sum(ticks), ticks[3] + ticks[4])
    return counters if set(counters) == set(cpus) else None


def choose_threads(
    requested: int | None, cpus: int, load: float | None, setting: str = "--threads", useful: int | None = None,
) -> ThreadChoice:
    """``requested``, or for ``auto`` (None) the ``cpus`` that ``load`` leaves free, at most ``useful`` (None: any)."""
    if requested is not None:
        return ThreadChoice(requested, cpus, None, setting)
    free = cpus if load is None else round(cpus - load)
    return ThreadChoice(min(cpus, useful or cpus, max(1, free)), cpus, load, AUTO)


def use_threads(requested: int | None, setting: str = "--threads", useful: int | None = None) -> ThreadChoice:
    """Choose the thread count for ``requested`` (None = auto, at most ``useful``) and give it to torch.
    ``auto`` keeps an OMP_NUM_THREADS the environment sets: the user's, or torchrun's one per process."""
    import torch  # here, not at import: the entry scripts import this module before torch on purpose

    cpus = usable_cpus()
    from_env = _omp_num_threads()
    if requested is not None:
        check_thread_count(requested, setting)
    if requested is None and from_env is not None:
        check_thread_count(from_env, "OMP_NUM_THREADS")
        choice = choose_threads(from_env, len(cpus), None, "OMP_NUM_THREADS")
    else:
        busy = None if requested is not None or useful == 1 else busy_cpus(cpus)
        choice = choose_threads(requested, len(cpus), busy, setting, useful)
    torch.set_num_threads(choice.threads)
    return choice


def _omp_num_threads() -> int | None:
    """OMP_NUM_THREADS as one count; None when unset or not a count OpenMP would take as one."""
    value = whole_number(os.environ.get("OMP_NUM_THREADS", ""))
    return value if value is not None and value >= 1 else None


def starved_advice(share: float, threads: int) -> str:
    """The one line a command prints when other programs keep it off the CPU (``share``: the
    fraction of the time its working thread was on a core)."""
    fix = ("close what else is running, or run it when the machine is quieter" if threads == 1
           else "try --threads 1, or close what else is running")
    return (f"note: other programs are using this machine's cores (this command was on a CPU {100 * share:.0f}% "
            f"of the time), so it runs slower than the machine can; {fix}")


def add_threads_argument(parser, default: str = AUTO, why: str = "") -> None:
    """The ``--threads`` flag every command that runs the model shares; ``why`` says why a command's
    default is what it is (``": ..."``)."""
    parser.add_argument(
        "--threads", default=default, metavar="N|auto",
        help=f"CPU threads for the model: N, or auto for the CPUs this process may use, less those other "
        f"programs keep busy (default: {default}{why})",
    )
