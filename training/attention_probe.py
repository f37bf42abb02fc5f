"""The attention probe a text run takes at every evaluation: each layer's attention entropy, the
induction scores and the loss on both copies of repeated sequences (``analysis.roles``), and now and
then a figure of the maps (``analysis.plot``). What it reads from the data is fixed when the run
starts, so two evaluations differ only by the weights."""

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from analysis.roles import attention_maps, attention_summary, probe_ids

WINDOWS = 4  # held-out windows the entropy is averaged over


@dataclass
class AttentionProbe:
    windows: torch.Tensor  # (WINDOWS or fewer, block_size) held-out token ids
    ids: torch.Tensor  # ids the induction probe draws repeats from
    prompt: str  # the text the figure shows the maps over
    prompt_ids: list[int]
    evaluations: int = field(default=0, init=False)  # recorded in this session (a figure every few)

    def record(self, model: nn.Module, logger: Any, step: int, tokenizer: Any, *, final: bool,
               image_interval: int) -> dict[str, float]:
        """An evaluation's numbers (``analysis.roles.attention_summary``), for its line of the metrics file and logged to wandb
        as ``attn/...``; at every ``image_interval``-th evaluation, and the final one, a figure of
        the maps too (0: never)."""
        stats = attention_summary(model, self.windows, self.ids)
        logger.log({f"attn/{k}": v for k, v in stats.items()}, step)
        self.evaluations += 1
        if logger.active and image_interval and (final or self.evaluations % image_interval == 1):
            # Every layer's maps over the prompt, beside the prompt's tokens as text.
            maps = attention_maps(model, torch.tensor([self.prompt_ids], device=self.windows.device))
            logger.log_attention_maps("attn/maps", [layer[0] for layer in maps],
                                      [tokenizer.decode([i]) for i in self.prompt_ids],
                                      f"step {step}: attention over {self.prompt!r}", step)
        return stats


def attention_probe(
    val_tokens: np.ndarray, tokenizer: Any, prompt: str, *, block_size: int, skip_id: int, device: torch.device,
) -> AttentionProbe | None:
    """The probe of a run over ``val_tokens``; None when they hold no full window.

    ``skip_id`` (the end-of-text id) is never drawn: a document boundary in the middle of a
    repeat would ask the model to forget it."""
    count = min(WINDOWS, len(val_tokens) // block_size)
    if count < 1:
        return None
    windows = np.asarray(val_tokens[:count * block_size], dtype=np.int64).reshape(count, block_size)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids[:block_size] or [0]
    return AttentionProbe(
        windows=torch.as_tensor(windows, device=device),
        ids=probe_ids(val_tokens, skip=[skip_id]),
        prompt=prompt,
        prompt_ids=prompt_ids,
    )
