"""Pretraining on documents (``data.format: text``): next-token prediction, where every target counts."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from data.batches.text import train_batches
from data.prepared.text import prepare_data
from data.tokenizer import EOT
from training.adapters import Adapters
from training.attention_probe import attention_probe
from training.checkpointing import capture_rng_state, restore_rng_state
from training.config import Config
from training.evaluate import evaluate, generate_sample
from training.result import Words
from training.tasks.task import Batches, Task, accumulate_gradients, fitted


class TextTask(Task):
    def __init__(self, prepared: Any, config: Config, device: torch.device) -> None:
        super().__init__(prepared, device)
        self.block_size = config.model.block_size
        self.sampling = config.train.sampling
        self.val_tokens = prepared.val_tokens()
        self.sample_prompt = config.eval.sample_prompt
        if self.sample_prompt is None:
            self.sample_prompt = default_sample_prompt(config.data.source, self.tokenizer, self.val_tokens)
        self.words = Words(whole_sample=True, epochs=(
            f"the training split ({len(prepared.train_tokens()):,} tokens): a model learns so small a text by heart "
            "and its validation loss rises; the run keeps the weights that validated best, but more text (or a "
            "smaller budget) trains a better model"))

    def batches(self, batch_size: int, **placement: Any) -> Batches:
        return train_batches(self.sampling, self.prepared.train_tokens(), self.block_size, batch_size, **placement)

    def accumulate(self, model, batches, micro_steps, *, amp, sync, ctx, stop):
        # A long accumulation is interruptible between micro-batches. Single process only: under
        # DDP every rank must reach the last micro-batch's all-reduce. The sampler and RNG states
        # are kept so that an abandoned step leaves the run exactly where the step found it.
        interruptible = micro_steps > 1 and not ctx.enabled
        before = (batches.state_dict(), capture_rng_state()) if interruptible else None
        computed = []

        def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
            x, y = batches.next()
            computed.append(x.numel())
            return x, y

        loss = accumulate_gradients(
            model, next_batch, micro_steps, amp=amp, sync=sync,
            should_stop=(lambda: stop.requested) if interruptible else None,
        )
        if loss is None:
            batches.load_state_dict(before[0])
            restore_rng_state(before[1])
            return None, 0
        return loss, sum(computed) * ctx.world_size

    def steps_per_epoch(self, rows_per_step):
        return len(self.prepared.train_tokens()) / (rows_per_step * self.block_size)

    def evaluate(self, model, **shared):
        return evaluate(model, self.val_tokens, self.token_bytes, block_size=self.block_size, **shared)

    def samples(self, model, settings):
        return [(self.sample_prompt, generate_sample(model, self.tokenizer, self.sample_prompt, settings))]

    def attention_probe(self, block_size, device):
        return attention_probe(self.val_tokens, self.tokenizer, self.sample_prompt, block_size=block_size,
                               skip_id=self.tokenizer.token_to_id(EOT), device=device)


def build(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool, device: torch.device,
          adapters: Adapters, resume: bool = False) -> TextTask:
    """The documents of ``config.data``, tokenized with ``tokenizer_file`` (None: train one)."""
    prepared = prepare_data(config.data, progress=progress, is_main=is_main, tokenizer_file=tokenizer_file)
    return TextTask(fitted(prepared, config), config, device)


SHAKESPEARE_PROMPT = "ROMEO:"
# Enough tokens to reach the first line of text, and few words: a prompt, not a passage.
_LOOKAHEAD_TOKENS = 256
_PROMPT_WORDS = 3
NEUTRAL_PROMPT = "The"


def default_sample_prompt(source: str, tokenizer: Tokenizer, val_tokens: Sequence[int]) -> str:
    """The sample prompt for a text run on ``source`` whose validation split is ``val_tokens``, when
    ``eval.sample_prompt`` is not set: "ROMEO:" means nothing to a model of code, so it comes from the
    run's data: a speaker's name for the plays, else the first words of the held-out text."""
    if source == "shakespeare":
        return SHAKESPEARE_PROMPT
    text = tokenizer.decode([int(t) for t in val_tokens[:_LOOKAHEAD_TOKENS]])
    for line in text.splitlines():
        words = line.split()
        if words:
            return " ".join(words[:_PROMPT_WORDS])
    return NEUTRAL_PROMPT
