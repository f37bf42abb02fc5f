"""The ``logging:`` section of a run config: how often training logs, and where wandb sends it."""

from __future__ import annotations

from dataclasses import dataclass, field

from common.config import check_types, require

WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass
class WandbConfig:
    mode: str = "auto"  # auto | online | offline | disabled
    project: str = "minigpt"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_types(self, "logging.wandb")
        require(self.mode in WANDB_MODES, f"logging.wandb.mode must be {', '.join(WANDB_MODES[:-1])} or "
                f"{WANDB_MODES[-1]} (got {self.mode!r})")


@dataclass
class LoggingConfig:
    interval: int = 10  # steps between lines in metrics.jsonl (and wandb points)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self) -> None:
        check_types(self, "logging")
        require(self.interval >= 1, "logging.interval must be >= 1")
