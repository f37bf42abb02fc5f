"""The model's shape, validated once when it is built and saved beside every checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_REQUIRED_INTS = ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd")


@dataclass
class GPTConfig:
    """Sizes of a decoder-only GPT with grouped-query attention and learned positions.

    ``n_kv_head`` key/value heads are shared by ``n_head // n_kv_head`` query heads each:
    1 gives multi-query attention, ``n_head`` gives standard multi-head attention.
    ``ffn_hidden=None`` derives the SwiGLU width from ``n_embd`` (see ``ffn_dim``).
    """

    vocab_size: int
    block_size: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_embd: int
    ffn_hidden: int | None = None
    dropout: float = 0.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in _REQUIRED_INTS:
            _check_positive_int(name, getattr(self, name))
        if self.ffn_hidden is not None:
            _check_positive_int("ffn_hidden", self.ffn_hidden)
        if self.n_embd % self.n_head != 0:
            raise ValueError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}); "
                f"pick n_head from the divisors of n_embd or change n_embd"
            )
        if self.n_head % self.n_kv_head != 0:
            raise ValueError(
                f"n_head ({self.n_head}) must be divisible by n_kv_head ({self.n_kv_head}); "
                f"set n_kv_head to a divisor of n_head (1 = multi-query, n_head = multi-head)"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise ValueError(f"dropout must be a number in [0, 1), got {self.dropout!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}; use 0.0 to disable it")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)):
            raise ValueError(f"norm_eps must be a positive number, got {self.norm_eps!r}")
        if not self.norm_eps > 0.0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}; the default is 1e-5")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"tie_embeddings must be true or false, got {self.tie_embeddings!r}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """SwiGLU hidden width: ``ffn_hidden`` if given, else 8/3·n_embd rounded up to 64.

        SwiGLU has three matrices instead of two, so 8/3 (not 4) keeps the parameter count of a
        classic 4x MLP; a multiple of 64 keeps matmul shapes friendly to vectorised kernels.
        """
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return 64 * -(-int(8 * self.n_embd / 3) // 64)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GPTConfig:
        """Build a config from a plain dict (JSON or YAML), rejecting unknown or missing keys."""
        if not isinstance(d, dict):
            raise ValueError(f"model config must be a mapping of field names to values, "
                             f"got {type(d).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(
                f"unknown model config key(s) {', '.join(map(repr, unknown))}; "
                f"valid keys are: {', '.join(known)}"
            )
        missing = [name for name in _REQUIRED_INTS if name not in d]
        if missing:
            raise ValueError(f"model config is missing {', '.join(map(repr, missing))}; "
                             f"add a positive integer for each")
        return cls(**d)


def _check_positive_int(name: str, value: Any) -> None:
    # bool is an int subclass; `n_layer: true` in a YAML file is a typo, not a size.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a positive integer, got {value!r}; write it as a whole number")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}; set it to at least 1")
