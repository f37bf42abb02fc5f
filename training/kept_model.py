"""Which weights a run keeps as its model, and the warning that a corpus is small for the budget.

A small corpus is soon learnt by heart, so ``model.safetensors`` holds the weights whose periodic
evaluation (the same fixed validation subset each time, the last step included) scored lowest. The
last state stays in the trainer checkpoint for ``--resume``, and the final full validation pass
scores the kept weights. A run without periodic evaluations keeps its last weights."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from model.io import load_pretrained
from training.adapters import Adapters
from training.distributed import is_sharded
from training.result import Words, epochs_warning

# A few passes over a corpus are normal; beyond this many a small model learns the text itself
# faster than the language, and the validation loss soon rises.
MANY_EPOCHS = 10.0


@dataclass
class KeptModel:
    """The step whose weights ``model.safetensors`` holds (None: none evaluated yet, so the run's
    checkpoints write their latest weights there) and its loss on the evaluation subset."""

    subset: tuple[int | None, int]  # (eval.max_batches, evaluation batch size): what the losses are over
    step: int | None = None
    val_loss: float | None = None
    evaluated_step: int | None = None  # the last step scored on the subset

    def record(self, step: int, val_loss: float) -> bool:
        """Note the evaluation of ``step``; True when its weights are now the kept ones (a tie keeps
        the earlier)."""
        self.evaluated_step = step
        if self.val_loss is not None and not val_loss < self.val_loss:
            return False
        self.step, self.val_loss = step, val_loss
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"subset": list(self.subset), "step": self.step, "val_loss": self.val_loss,
                "evaluated_step": self.evaluated_step}

    def load_state_dict(self, state: dict[str, Any] | None) -> bool:
        """Continue from a checkpoint's record; False (nothing loaded) when it has none, or when its
        losses were measured over another subset and no longer compare."""
        if not isinstance(state, dict) or tuple(state.get("subset") or ()) != tuple(self.subset):
            return False
        self.step, self.val_loss = state["step"], state["val_loss"]
        self.evaluated_step = state["evaluated_step"]
        return True


def load_kept_weights(model: nn.Module, run_dir: Path, adapters: Adapters) -> None:
    """Put the run's ``model.safetensors`` into ``model``, whole or sharded (every process reads the
    shared file), for the final validation pass: ``adapters`` fold into their frozen base."""
    weights = load_pretrained(run_dir).state_dict()
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(adapters.state_for(model, weights))


def epochs(steps: float, steps_per_epoch: float | None) -> float | None:
    """How many times ``steps`` of training pass over a training split of ``steps_per_epoch`` steps."""
    return steps / steps_per_epoch if steps_per_epoch else None


@dataclass
class CorpusCheck:
    """Compares the budget with the training split once, as soon as the run's end is known (a clock
    budget needs the pace of a few steps first); the task words the warning."""

    steps_per_epoch: float | None  # optimizer steps in one pass over the training split (None: not counted)
    tokens_per_step: int
    max_tokens: int | None  # train.max_tokens, for a run whose end is not known in steps
    words: Words  # the task's, which word the warning (``training.result.epochs_warning``)
    done: bool = False

    def warning(self, bar: Any, step: int, elapsed_s: float) -> str | None:
        """The task's warning, the first time the progress ``bar`` knows the end, when the budget passes
        over the training split more than ``MANY_EPOCHS`` times; None otherwise."""
        if self.done or (bar.schedule.max_seconds is not None and not bar.throughput.full):
            return None
        self.done = True
        steps = bar.expected_steps(step, elapsed_s)
        if steps is None and self.max_tokens:
            steps = self.max_tokens / self.tokens_per_step
        passes = epochs(steps or 0, self.steps_per_epoch)
        return epochs_warning(self.words, passes) if passes is not None and passes > MANY_EPOCHS else None
