"""The equal-steps screening of benchmarks/quality_per_minute.py: its arithmetic and table (its refusals:
test_benchmark_arguments.py)."""

import math

import pytest

from benchmarks.quality_per_minute import Screened, equal_time_estimate, log_slope, screening_table

# A baseline that gains 0.1 bits/byte per e-fold of steps: 2.0 at 1000 steps, 2.1 at 1000/e.
LONG = [(1000, 1.99), (1000, 2.01)]
SHORT = [(368, 2.09), (368, 2.11)]


def test_the_slope_and_the_equal_time_estimate():
    assert log_slope(LONG, SHORT) == pytest.approx(-0.1 / math.log(1000 / 368), rel=1e-9)
    assert log_slope(LONG, [(368, 2.0), (368, 2.0)]) == pytest.approx(0.0)  # a flat curve
    # A tie at equal steps wins at equal time only when faster.
    slope = -0.1  # more steps help
    assert equal_time_estimate(0.0, slope, ratio=0.8) < 0  # faster: more steps in the same time
    assert equal_time_estimate(0.0, slope, ratio=1.25) > 0  # slower: fewer steps
    assert equal_time_estimate(0.0, slope, ratio=1.0) == 0
    # Twice as slow costs the baseline's loss from halving its steps.
    assert equal_time_estimate(-0.05, slope, ratio=2.0) == pytest.approx(-0.05 + 0.1 * math.log(2.0))


def test_the_table_gives_each_technique_its_difference_cost_and_estimate():
    rows = [Screened("baseline", LONG, None), Screened("cheap-win", [(1000, 1.97), (1000, 1.99)], (0.9, 0.95, 1.0)),
            Screened("costly-win", [(1000, 1.97), (1000, 1.99)], (1.9, 2.0, 2.1))]
    table = screening_table(rows, SHORT)
    lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "| +0.0000 | 1 (itself) | 0 |" in lines["baseline"]
    assert "| -0.0200 | 0.950 (0.900-1.000) |" in lines["cheap-win"] and lines["cheap-win"].endswith("| -0.0251 |")
    # The same gain at twice the cost is lost at equal time: -0.02 + 0.1·ln 2 / ln(1000/368).
    assert "| -0.0200 | 2.000 (1.900-2.100) |" in lines["costly-win"] and lines["costly-win"].endswith("| +0.0493 |")
    assert "spread between the baseline's seeds 0.0200" in table
