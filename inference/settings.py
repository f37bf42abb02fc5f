"""How to sample: one dataclass holding the defaults that ``generate.py --help`` shows.

It imports nothing heavy, so the command line can validate its flags before torch loads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import UserError

# When the window of tokens the model sees reaches block_size, generation keeps this fraction of it
# (the most recent tokens) and re-encodes them from position 0: learned absolute positions cannot
# slide. Half a window leaves room for block_size / 2 new tokens before the next re-encode.
CONTEXT_KEEP_FRACTION = 0.5

_MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a signed 64-bit value


@dataclass(frozen=True)
class GenerationSettings:
    """Sampling settings; the defaults are the command line's defaults.

    ``seed`` None means a fresh random seed (reported with the result, so any run can be
    repeated). Row i of ``num_samples`` uses a generator seeded ``seed + i``, so it equals the
    single-sample run with seed ``seed + i``. ``stop``: generation of a row ends as soon as one of
    these strings appears in its continuation; the text ends just before the stop string.
    """

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
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(
                f"temperature must be a finite number >= 0 (got {self.temperature}); use 0 for greedy decoding"
            )
        if self.top_k is not None and self.top_k < 1:
            raise UserError(f"top_k must be >= 1 (got {self.top_k}); leave it out to sample from all tokens")
        if not 0 < self.top_p <= 1:  # also rejects NaN
            raise UserError(f"top_p must be in (0, 1] (got {self.top_p}); use 1 to turn nucleus sampling off")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise UserError(
                f"repetition_penalty must be a finite number > 0 (got {self.repetition_penalty}); "
                "1 means no penalty"
            )
        if self.num_samples < 1:
            raise UserError(f"num_samples must be >= 1 (got {self.num_samples})")
        if self.seed is not None and not 0 <= self.seed <= _MAX_SEED - self.num_samples:
            raise UserError(f"seed must be between 0 and 2**63 - 1 - num_samples (got {self.seed})")
        if any(not s for s in self.stop):
            raise UserError("a stop string must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
