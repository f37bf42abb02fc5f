"""The training progress bar: the steps done out of those planned, or under a clock budget the
seconds trained out of the budget's (the steps then in the postfix), with the loss, learning rate,
throughput, model FLOP utilisation and the time left."""

import math
from typing import Callable

from tqdm.auto import tqdm

from training.metrics import Throughput, format_duration
from training.optim import LRSchedule

# A clock budget is drawn as time: the steps it allows are only an estimate that moves with the pace,
# and a total that jumps as it is re-estimated reads as a broken bar. The postfix's "left" (the sooner
# of both budgets) replaces tqdm's estimate, which assumes the whole total runs.
_CLOCK_BAR = "{l_bar}{bar}| {n:.0f}/{total:.0f} s{postfix}"


class StepBar:
    """A tqdm bar over optimizer steps, or seconds under a clock budget; ``utilization`` maps tokens
    per second to the MFU."""

    def __init__(self, schedule: LRSchedule, throughput: Throughput, utilization: Callable[[float], float], *,
                 step: int, elapsed_s: float, enabled: bool) -> None:
        self.schedule, self.throughput, self.utilization = schedule, throughput, utilization
        self.by_clock = schedule.max_seconds is not None
        self._bar = tqdm(
            total=schedule.max_seconds if self.by_clock else schedule.max_steps,
            initial=min(elapsed_s, schedule.max_seconds) if self.by_clock else step, disable=not enabled,
            desc="train", unit="s" if self.by_clock else "step", dynamic_ncols=True,
            bar_format=_CLOCK_BAR if self.by_clock else None,
        )

    def __enter__(self) -> "StepBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()

    def advance(self, step: int, elapsed_s: float, loss: float, lr: float) -> None:
        """One more step done, the run now at ``step`` after ``elapsed_s`` seconds of training."""
        self._bar.set_postfix_str(self._postfix(step, elapsed_s, loss, lr), refresh=False)
        self._bar.update(min(elapsed_s, self._bar.total) - self._bar.n if self.by_clock else 1)

    def complete(self, step: int) -> None:
        """The budget that bound is used up: a full bar."""
        if self.by_clock:
            self._bar.n = self._bar.total
        else:
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
        parts = [f"step {step}"] if self.by_clock else []
        parts += [f"loss {loss:.4f}", f"lr {lr:.2e}", f"{tokens_per_s / 1e3:.1f}k tok/s", f"mfu {100 * util:.1f}%"]
        # Time left is the sooner of the step budget (at the current pace) and the clock budget.
        left = []
        if self.schedule.max_steps is not None and self.throughput.seconds_per_step() > 0:
            left.append((self.schedule.max_steps - step) * self.throughput.seconds_per_step())
        if self.schedule.max_seconds is not None:
            left.append(self.schedule.max_seconds - elapsed_s)
        if left:
            parts.append(f"left {format_duration(min(left))}")
        return " | ".join(parts)
