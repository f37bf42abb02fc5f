"""The thread policy every command shares (common/threads.py)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.errors import UserError
from common.threads import WORKER_SPIN, busy_cpus, choose_threads, parse_threads, starved_advice, use_threads
from training.metrics import Throughput

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value, expected", [("auto", None), (None, None), ("3", 3), (2, 2), (" 1 ", 1), (8, 8)])
def test_threads_parse_auto_or_a_count(value, expected):
    assert parse_threads(value, cpus=8) == expected


NOT_A_COUNT = r"^--threads must be auto or a whole number of threads >= 1"
TOO_MANY = r"^--threads asks for {} threads, more than the 8 CPUs of this machine; give at most 8, or auto$"


# "²" passes str.isdigit and "１２" passes int(): neither is a count a user meant to type.
@pytest.mark.parametrize("value, fragment", [
    *[(value, NOT_A_COUNT) for value in (0, -1, "0", "x", "1.5", 1.5, True, "", "2 threads", "²", "１２", "1_0")],
    *[(value, TOO_MANY.format(int(value))) for value in ("9", 64, "1000000000")],
])
def test_bad_thread_counts_are_refused_in_one_line(value, fragment):
    with pytest.raises(UserError, match=fragment):
        parse_threads(value, cpus=8)


def test_the_environment_and_the_config_are_held_to_the_cpus_too(monkeypatch):
    # OpenMP sizes its pool by the count: a thousand million ran the machine out of memory.
    before = torch.get_num_threads()
    too_many = str((os.cpu_count() or 1) + 1)
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", too_many)
        with pytest.raises(UserError, match=f"^OMP_NUM_THREADS asks for {too_many} threads.*or unset it$"):
            use_threads(None)
        with pytest.raises(UserError, match=f"^train.threads asks for {too_many} threads"):
            use_threads(int(too_many), "train.threads")
        assert torch.get_num_threads() == before  # refused before torch was given the count
        monkeypatch.setenv("OMP_NUM_THREADS", "²")  # not a count: OpenMP ignores it, and so does auto
        assert use_threads(None).source == "auto"
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("asked, cpus, load, useful, threads", [
    (None, 2, 0.0, None, 2),  # a quiet machine: every CPU
    (None, 2, None, None, 2),  # no counters to read: every CPU
    (None, 2, 0.4, None, 2),  # light background work does not cost a core
    (None, 2, 1.2, None, 1),  # one core's worth of other work: the other core
    (None, 2, 7.5, None, 1),  # far more work than cores: still one thread, never none
    (None, 8, 3.0, None, 5),
    (None, 8, 0.0, 1, 1),  # work that can use one thread (one decoding stream) gets one
    (None, 8, 6.0, 4, 2),  # the free CPUs bind first
    (3, 8, 0.0, 1, 3),  # an explicit count wins over what the work can use
    (6, 2, 9.0, None, 6),  # and over the CPUs and their load: never second-guessed
])
def test_auto_takes_the_cpus_other_programs_leave_free_and_an_explicit_count_wins(asked, cpus, load, useful, threads):
    choice = choose_threads(asked, cpus, load, **({"useful": useful} if useful else {}))
    assert choice.threads == threads and choice.source == ("auto" if asked is None else "--threads")
    assert choice.describe().startswith(f"{threads} thread")
    assert asked is None or choice.describe() == f"{threads} threads (--threads)"


def test_use_threads_gives_torch_the_choice_and_keeps_the_environments(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what torchrun sets for several processes
        choice = use_threads(None)
        assert (choice.threads, choice.source, torch.get_num_threads()) == (1, "OMP_NUM_THREADS", 1)
        choice = use_threads(2, "train.threads")  # an explicit setting wins over the environment
        assert (choice.threads, choice.source, torch.get_num_threads()) == (2, "train.threads", 2)
        monkeypatch.delenv("OMP_NUM_THREADS")
        choice = use_threads(None)
        assert choice.source == "auto" and 1 <= choice.threads <= len(os.sched_getaffinity(0))
        assert torch.get_num_threads() == choice.threads
    finally:
        torch.set_num_threads(before)


_ENTRY_POINTS = [
    ["train.py", "--config", "configs/tiny.yaml", "--threads", "0"],
    ["generate.py", "--threads", "0"],
    ["serve.py", "--threads", "0"],
    ["attention.py", "--prompt", "x", "--threads", "0"],
    ["evaluate.py", "--run", "no-such-run"],  # it loads torch only once its flags are good
]


def _openmp_spin_count(command: list[str], **env: str) -> str | None:
    """GNU OpenMP's spin count as it initialised in ``command`` (its OMP_DISPLAY_ENV report)."""
    environment = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    environment.update(OMP_DISPLAY_ENV="verbose", **env)
    done = subprocess.run([sys.executable, *command], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "error: " in done.stderr, done.stderr[-500:]
    line = next((l for l in done.stderr.splitlines() if l.strip().startswith("GOMP_SPINCOUNT")), None)
    return None if line is None else line.split("=", 1)[1].strip().strip("'")


@pytest.mark.e2e  # starts every command: the slowest test of the default suite
def test_every_command_shortens_openmp_workers_spin():
    # Beside other work, spinning workers made each operation wait for a parked worker.
    if _openmp_spin_count(["-c", "import sys, torch; sys.stderr.write('error: none'); "
                                 "sys.exit(2)"]) is None:
        pytest.skip("this torch build does not use GNU OpenMP, whose wait policy the commands set")
    for command in _ENTRY_POINTS:
        assert _openmp_spin_count(command) == WORKER_SPIN, command[0]
    # A wait policy or a spin the user chose is kept.
    assert _openmp_spin_count(_ENTRY_POINTS[1], OMP_WAIT_POLICY="passive") == "0"
    assert _openmp_spin_count(_ENTRY_POINTS[1], GOMP_SPINCOUNT="1234") == "1234"


def _measured_share(work) -> float:
    throughput = Throughput(window=3)
    for _ in range(3):
        t0, cpu0 = time.perf_counter(), time.thread_time()
        work()
        throughput.add(1, time.perf_counter() - t0, time.thread_time() - cpu0)
    return throughput.cpu_seconds_per_second()


def test_the_starvation_gauge_reads_off_cpu_time_as_starved_and_computing_as_not():
    # Known answers: a thread that sleeps is off the CPU, one that computes is on it.
    assert _measured_share(lambda: time.sleep(0.05)) < 0.2

    def compute():
        end = time.perf_counter() + 0.05
        while time.perf_counter() < end:
            pass

    assert _measured_share(compute) > 0.5 or os.getloadavg()[0] > 2 * len(os.sched_getaffinity(0)), \
        "a computing thread read as starved on a machine that is not overloaded"
    # The advice names the cause and the fix.
    assert "--threads 1" in starved_advice(0.3, 2) and "30%" in starved_advice(0.3, 2)
    assert "--threads 1" not in starved_advice(0.3, 1)


def test_a_cpu_kept_busy_by_another_program_is_counted_as_busy():
    cpu = min(os.sched_getaffinity(0))
    spin = "import os, time\nos.sched_setaffinity(0, {%d})\nend = time.time() + 30\nwhile time.time() < end: pass\n" % cpu
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)  # past its start-up, spinning on that CPU
        busy = busy_cpus(frozenset({cpu}), seconds=0.3)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and busy > 0.8, busy  # the CPU was never idle while it spun
    everywhere = busy_cpus(frozenset(os.sched_getaffinity(0)))
    assert everywhere is None or 0.0 <= everywhere <= len(os.sched_getaffinity(0))
