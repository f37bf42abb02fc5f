"""The ``logging:`` section of a run config: how often training logs, and where wandb sends it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from common.config import Section

WANDB_MODES = ("auto", "online", "offline", "disabled")


class WandbConfig(Section):
    mode: Literal[WANDB_MODES] = "auto"
    project: str = "minigpt"
    entity: str | None = None
    name: str | None = None
    tags: list[str] = []


class LoggingConfig(Section):
    interval: int = Field(10, ge=1, description="steps between lines in metrics.jsonl (and wandb points)")
    wandb: WandbConfig = WandbConfig()
