"""What a run says: each task's ``Words`` (how its numbers read), the one formatter that phrases
them, and ``TrainResult``, what a finished (or interrupted) run reached, which ``train.py`` words for
the user (``training.cli``) and whose numbers close the run's wandb record."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Words:
    """How a task's numbers read. The templates are ``str.format`` strings over an evaluation's
    ``loss``, ``bpb`` and metrics (``{rewards/accuracies:.3f}``); the functions below read them."""

    eval: str = "loss {loss:.4f} nats/token, {bpb:.4f} bits/byte"  # an evaluation's console line
    final: str = "{bpb:.4f} bits/byte ({loss:.4f} nats/token)"  # the final evaluation, in the summary
    note: str | None = None  # what else an evaluation measured, said where it has the fields named
    kept_by: str = "validation loss"  # what the kept weights scored best (``training.kept_model``)
    kept: str = "{loss:.4f} nats/token"  # that loss in words ({passed}: 1 - loss, an RL run's pass@1)
    epochs: str | None = None  # what "about N epochs of ..." a budget of many passes is warned of
    batches: str | None = None  # a line on the batches when the run starts ({padding}: their padded share)
    warning: str | None = None  # a warning about the prepared data, said once when the run starts
    whole_sample: bool = False  # a sample is one document, its prompt inside its text (not prompt + reply)


def _fields(result: Any) -> dict[str, Any]:
    return {"loss": result.loss, "bpb": result.bpb, **result.metrics}


def note(words: Words, result: Any) -> str | None:
    """``words.note`` of an evaluation that measured what it names (None otherwise)."""
    try:
        return words.note.format(**_fields(result)) if words.note else None
    except KeyError:
        return None


def eval_line(words: Words, scope: str, step: int, result: Any, samples: list[tuple[str, str]]) -> str:
    """An evaluation as the console shows it, its first sample's lines indented under it."""
    said = note(words, result)
    lines = [f"step {step} {scope}: {words.eval.format(**_fields(result))}" + (f"; {said}" if said else "")]
    shown = [text if words.whole_sample else prompt + text for prompt, text in samples[:1]]
    return "\n".join(lines + ["  sample: " + text.replace("\n", "\n          ") for text in shown])


def final_words(words: Words, result: Any) -> tuple[str, str | None]:
    """The final evaluation in the summary's words, and its note."""
    return words.final.format(**_fields(result)), note(words, result)


def sample_fields(words: Words, samples: list[tuple[str, str]]) -> dict[str, Any]:
    """What an evaluation's line in the metrics file keeps of ``samples``."""
    if words.whole_sample:
        return {"sample": samples[0][1]} if samples else {}
    return {"samples": [{"prompt": p, "reply": r} for p, r in samples]}


def kept_score(words: Words, loss: float) -> str:
    return words.kept.format(loss=loss, passed=1 - loss)


def epochs_warning(words: Words, passes: float) -> str | None:
    """The one-line warning for a budget of ``passes`` over the training split."""
    return f"warning: the budget is about {passes:.0f} epochs of {words.epochs}" if words.epochs else None


def batches_line(words: Words, batches: Any) -> str | None:
    """The line on a run's batches when it starts (None: nothing to say)."""
    padded = getattr(batches, "epoch_padding_fraction", None)  # a padded batch's share over an epoch
    return words.batches.format(padding=padded() if padded else None) if words.batches else None


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
