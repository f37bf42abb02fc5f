"""Every script in benchmarks/ is run by name in test_benchmarks_run.py (reads files only)."""

from __future__ import annotations

import re
from pathlib import Path

from bench_testkit import benchmark_scripts


def test_every_benchmark_script_has_a_smoke_test() -> None:
    scripts = set(benchmark_scripts())
    smoke = (Path(__file__).parent / "test_benchmarks_run.py").read_text()
    run = set(re.findall(r'\bbench\("(\w+)"', smoke))
    assert scripts, "no benchmark scripts found"
    assert scripts <= run, f"benchmarks without a smoke test in test_benchmarks_run.py: {sorted(scripts - run)}"
