"""The training progress bar: the steps done out of those the binding budget allows, with the
loss, learning rate, throughput, model FLOP utilisation and the time left."""

from __future__ import annotations

import math
from typing import Callable

from tqdm.auto import tqdm

from training.metrics import Throughput, format_duration
from training.optim import LRSchedule

# tqdm's default bar without its "<remaining" estimate, for a clock budget: tqdm's estimate assumes
# every step of max_steps will run, while the postfix's "left" (the sooner of both budgets) knows.
_BAR_WITHOUT_ETA = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"


class StepBar:
    """A tqdm bar over optimizer steps; ``utilization`` maps tokens per second to the MFU."""

    def __init__(self, schedule: LRSchedule, throughput: Throughput, utilization: Callable[[float], float], *,
                 step: int, elapsed_s: float, enabled: bool) -> None:
        self.schedule, self.throughput, self.utilization = schedule, throughput, utilization
        self._bar = tqdm(
            total=self.expected_steps(step, elapsed_s), initial=step, disable=not enabled, desc="train",
            unit="step", dynamic_ncols=True, bar_format=None if schedule.max_seconds is None else _BAR_WITHOUT_ETA,
        )

    def __enter__(self) -> StepBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()

    def advance(self, step: int, elapsed_s: float, loss: float, lr: float) -> None:
        """One more step done, the run now at ``step`` after ``elapsed_s`` seconds of training."""
        self._bar.total = self.expected_steps(step, elapsed_s)
        self._bar.update(1)
        self._bar.set_postfix_str(self._postfix(step, elapsed_s, loss, lr), refresh=False)

    def complete(self, step: int) -> None:
        """The budget that bound is used up: a full bar."""
        self._bar.total = step
        self._bar.refresh()

    def expected_steps(self, step: int, elapsed_s: float) -> int | None:
        """The step the run will end at, by the budget that binds: the planned steps, or fewer
        when the clock will end the run first at the current pace (None: not known yet)."""
        planned, max_seconds = self.schedule.max_steps, self.schedule.max_seconds
        pace = self.throughput.seconds_per_step()
        if max_seconds is None or pace <= 0:
            return planned
        by_clock = step + math.ceil(max(0.0, max_seconds - elapsed_s) / pace)
        return by_clock if planned is None else min(planned, by_clock)

    def _postfix(self, step: int, elapsed_s: float, loss: float, lr: float) -> str:
        tokens_per_s = self.throughput.tokens_per_second()
        util = self.utilization(tokens_per_s)
        parts = [f"loss {loss:.4f}", f"lr {lr:.2e}", f"{tokens_per_s / 1e3:.1f}k tok/s", f"mfu {100 * util:.1f}%"]
        # Time left is the sooner of the step budget (at the current pace) and the clock budget.
        left = []
        if self.schedule.max_steps is not None and self.throughput.seconds_per_step() > 0:
            left.append((self.schedule.max_steps - step) * self.throughput.seconds_per_step())
        if self.schedule.max_seconds is not None:
            left.append(self.schedule.max_seconds - elapsed_s)
        if left:
            parts.append(f"left {format_duration(min(left))}")
        return " | ".join(parts)
