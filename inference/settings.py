"""generate.py's settings: the shared sampling settings, plus how many samples, whether cached and
whether the decode step is compiled.

This is the command line's edge: the values are checked here, once, with messages for the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.errors import UserError
from inference.sampling import MAX_SEED, SamplingSettings, check_sampling_args, rolls_past_window

if TYPE_CHECKING:
    from model import GPTConfig

# Samples decode as one batch through one cache; beyond this the cache alone outgrows a laptop.
MAX_NUM_SAMPLES = 1024


@dataclass(frozen=True)
class GenerationSettings(SamplingSettings):
    """``SamplingSettings`` with the command line's defaults, and row i of ``num_samples`` seeded
    ``seed + i``; ``seed`` None means a fresh random seed, reported with the result so any run can
    be repeated."""

    num_samples: int = 1
    use_cache: bool = True
    compile: bool = False  # decode through inference.compiled_step (the command line chose it)
    sinks: int | None = None  # the first tokens a rolling window keeps; None: the window's default (checked_sinks)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise UserError(f"max_new_tokens must be >= 0 (got {self.max_new_tokens})")
        try:
            check_sampling_args(self.temperature, self.top_k, self.top_p, self.repetition_penalty)
        except ValueError as e:
            raise UserError(str(e)) from None
        if not 1 <= self.num_samples <= MAX_NUM_SAMPLES:
            raise UserError(
                f"num_samples must be >= 1 and at most {MAX_NUM_SAMPLES} (got {self.num_samples}): all samples "
                f"share one batch and its KV cache; run the command several times for more"
            )
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED - self.num_samples:
            raise UserError(f"seed must be between 0 and 2**63 - 1 - num_samples (got {self.seed})")
        if any(not s for s in self.stop):
            raise UserError("a stop string must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def checked_sinks(flag: int | None, config: GPTConfig) -> int | None:
    """``--sinks`` (``flag``) for a run of ``config``; None when not given, for the default that fits
    the run's window (``inference.sampling.default_sinks``). Refuses a flag that cannot apply: a
    learned-position run re-encodes past its window and keeps no sinks, and a window keeps at most
    all but its newest token."""
    if flag is None:
        return None
    if not rolls_past_window(config.positions):
        raise UserError("--sinks applies to runs with rotary or no positions, which roll past the window; "
                        "this run has learned positions and re-encodes instead: drop --sinks")
    if not 0 <= flag < config.block_size:
        raise UserError(f"--sinks must be 0 to {config.block_size - 1} (the window less one), got {flag}")
    return flag
