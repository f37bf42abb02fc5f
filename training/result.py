"""What a finished (or interrupted) training run reached: ``TrainResult``, which ``train.py`` words for
the user (``training.cli``) and whose numbers close the run's wandb record."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainResult:
    run_dir: Path
    step: int  # optimizer steps taken in total (including those before a resume)
    tokens_seen: int
    stopped_by: str  # max_steps | max_tokens | max_minutes | interrupted
    train_seconds: float
    val_loss: float | None = None  # from the final full validation pass (None when interrupted)
    val_bpb: float | None = None
    last_loss: float | None = None  # training loss of the last step
    signal: int | None = None  # the signal that interrupted the run
    is_main: bool = True  # rank 0 (or a single process): the one that reports to the user
    kind: str = "text"  # what it learned from (data.format): text, chat, preference or rl
    parent: Path | None = None  # the run it fine-tuned (train.init_from)
    wandb_sync: str | None = None  # the command that uploads an offline wandb run
    starved_share: float | None = None  # set when other programs left the run under half its CPU time
    sample_prompt: str | None = None  # what the evaluation samples continued, or the question they answered
    kept_step: int | None = None  # the step whose weights model.safetensors holds (training.kept_model)
    kept_val_loss: float | None = None  # their loss on the evaluation subset (None: never evaluated on it)
    last_val_loss: float | None = None  # the last step's loss on that subset
    kept_by: str = "validation loss"  # what that loss is, in the task's words (RL: held-out pass@1)
    kept_score: str | None = None  # kept_val_loss in the task's words
    last_score: str | None = None  # last_val_loss in the task's words
    epochs: float | None = None  # passes over the training split (None: not known for this task)
    threads: int = 1  # torch's threads in this session
    earlier_seconds: float = 0.0  # training time of the sessions before this one (a resumed run)
    adapter: str | None = None  # a LoRA run: how many parameters trained, and the adapter's size
    val_words: str | None = None  # the final evaluation in the task's words (None when interrupted)
    val_note: str | None = None  # what else it measured, a line of the summary (a chat run's ended replies)
    # The adapters' own numbers for the wandb summary (a LoRA run: trained_params, adapter_bytes).
    adapter_numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def interrupted(self) -> bool:
        return self.stopped_by == "interrupted"

    def summary(self) -> dict[str, Any]:
        """The run's wandb summary."""
        numbers = {"step": self.step, "tokens": self.tokens_seen, "stopped_by": self.stopped_by, **self.adapter_numbers}
        if self.val_loss is not None:
            numbers.update(val_loss=self.val_loss, val_bpb=self.val_bpb)
        return numbers
