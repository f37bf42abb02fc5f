"""benchmarks/step_profile.py's accounting: which operator counts as which kind of work, in which
phase, and what is left to Python. (It runs end to end in test_benchmarks_run.py.)"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from benchmarks.step_profile import kind_of, summarize, tables


@dataclass
class Event:  # the fields of torch.profiler's FunctionEvent that the summary reads, in microseconds
    name: str
    cpu_parent: Event | None = None
    cpu_time_total: float = 0.0
    self_cpu_time_total: float = 0.0


@pytest.mark.parametrize("op,kind", [("aten::mm", "matmul"), ("aten::baddbmm", "matmul"),
                                     ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
                                     ("aten::add_", "other ops"), ("aten::linear", "other ops")])
def test_each_operator_counts_as_its_kind(op, kind):
    assert kind_of(op) == kind


def test_own_times_go_to_the_nearest_phase_and_the_rest_is_python():
    forward = Event("forward", cpu_time_total=10_000)  # 10 ms over two steps
    optimizer = Event("optimizer", cpu_time_total=4_000)
    linear = Event("aten::linear", forward, self_cpu_time_total=500)  # a composite: its own time only
    events = [forward, optimizer, linear,
              Event("aten::mm", linear, self_cpu_time_total=6_000),
              Event("aten::add_", forward, self_cpu_time_total=1_000),
              Event("aten::baddbmm", Event("Muon.step", optimizer), self_cpu_time_total=3_000),
              Event("aten::mm", None, self_cpu_time_total=99_000)]  # outside every phase: not counted
    profile = summarize(events, steps=2)
    assert profile.by_kind("forward") == {"matmul": 3.0, "attention": 0.0, "other ops": 0.75,
                                          "Python and dispatch": 1.25}
    assert profile.by_kind("optimizer") == {"matmul": 1.5, "attention": 0.0, "other ops": 0.0,
                                            "Python and dispatch": 0.5}
    table = tables(profile)
    assert "step: 7.0 ms" in table and "| forward | 5.0 | 71.4% |" in table
    assert "| **all** | 4.5 ms (64%) | 0.0 ms (0%) | 0.8 ms (11%) | 1.8 ms (25%) |" in table
