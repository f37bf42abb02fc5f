"""How to sample: one dataclass holding the defaults that ``generate.py --help`` shows.

The sampling values are checked by ``model.generation.check_sampling_args``, like every other
caller's; the rest (sample count, seed, stop strings) only exist here.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import UserError
from model.generation import check_sampling_args

_MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit value
# Samples decode as one batch through one cache; beyond this the cache alone outgrows a laptop.
MAX_NUM_SAMPLES = 1024


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling settings; the defaults are the command line's. ``seed`` None means a fresh random
    seed, reported with the result so any run can be repeated; row i of ``num_samples`` is seeded
    ``seed + i``. ``stop``: a row ends where one of these strings appears, the text just before it."""

    max_new_tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float = 0.95
    repetition_penalty: float = 1.0
    num_samples: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    use_cache: bool = True

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
        if self.seed is not None and not 0 <= self.seed <= _MAX_SEED - self.num_samples:
            raise UserError(f"seed must be between 0 and 2**63 - 1 - num_samples (got {self.seed})")
        if any(not s for s in self.stop):
            raise UserError("a stop string must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
