"""The DPO task (``data.format: preference``): a chat run learns, from reply pairs, to prefer each chosen
reply over its rejected one, measured against its frozen parent."""

from pathlib import Path
from typing import Any

import torch

from training.adapters import Adapters
from training.config import Config, ConfigError
from training.result import Words
from training.tasks.chat import ENDED_NOTE, ChatTask
from training.tasks.dpo.batches import PreferenceBatches
from training.tasks.dpo.config import DPOConfig
from training.tasks.dpo.loss import accumulate_dpo_gradients, evaluate_preferences
from training.tasks.dpo.prepared import prepare_preference_data
from training.tasks.reference import Reference, reference_for
from training.tasks.task import Batches, fitted, parent_tokenizer


# Below this many held-out pairs, rewards/accuracies is too coarse to choose the kept weights by.
FEW_HELD_OUT_PAIRS = 10


class PreferenceTask(ChatTask):
    """Scored against the frozen ``reference``; its samples are replies to held-out prompts."""

    def __init__(self, prepared: Any, device: torch.device, reference: Reference, dpo: DPOConfig) -> None:
        super().__init__(prepared, device)
        self.reference = reference
        self.beta = dpo.beta
        self.rpo_alpha = dpo.rpo_alpha
        self.step_metrics: dict[str, float] = {}  # the last step's, for its line of the metrics file
        loss_name, held_out = "DPO+RPO loss" if self.rpo_alpha else "DPO loss", len(prepared.val)
        score = (f"{loss_name} {{loss:.4f}}, rewards/accuracies {{rewards/accuracies:.3f}}, rewards/margins "
                 "{rewards/margins:.4f} on held-out pairs; {bpb:.4f} bits/byte of the chosen replies, <|end|> charged")
        self.words = Words(
            eval=score, final=score, note=ENDED_NOTE, kept_by=f"held-out {loss_name}", kept="{loss:.4f}",
            epochs=f"the {len(prepared.train):,} training pairs: DPO learns so few pairs by heart, and its held-out "
            "rewards/accuracies then say little; more pairs (or a smaller budget) train a better model",
            batches=f"preference batches: {len(prepared.train)} training pairs, each a chosen and a rejected row; "
            "{padding:.1%} of computed tokens are padding",
            warning=None if not 0 < held_out < FEW_HELD_OUT_PAIRS else (
                f"warning: only {held_out} held-out pair{'s' if held_out != 1 else ''}: rewards/accuracies moves in "
                f"steps of {1 / held_out:.2f} and the kept weights are chosen on so few; give more pairs or raise "
                "data.val_fraction"))

    def batches(self, batch_size: int, **placement: Any) -> Batches:
        return PreferenceBatches(self.prepared.train, batch_size, pad_id=self.prepared.eot_id, **placement)

    def accumulate(self, model, batches, micro_steps, *, amp, sync, ctx, stop):
        micro_batches = [batches.next() for _ in range(micro_steps)]
        loss, self.step_metrics = accumulate_dpo_gradients(model, self.reference, micro_batches, beta=self.beta,
                                                           rpo_alpha=self.rpo_alpha, amp=amp, sync=sync, ctx=ctx)
        return loss, sum(x.numel() for x, _ in micro_batches) * ctx.world_size

    def evaluate(self, model, **shared):
        return evaluate_preferences(model, self.reference, self.prepared.val, self.token_bytes, beta=self.beta,
                                    rpo_alpha=self.rpo_alpha, pad_id=self.prepared.eot_id, **shared)

    def train_fields(self, batches):
        metrics = {name: value for name, value in self.step_metrics.items() if name != "loss"}
        return {**metrics, "beta": self.beta, "rpo_alpha": self.rpo_alpha, "padding_fraction": batches.padding_fraction}


def build(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool, device: torch.device,
          adapters: Adapters, resume: bool = False) -> PreferenceTask:
    """The reply pairs of ``config.data``, rendered with the parent run's tokenizer, and the parent
    as the frozen reference."""
    tokenizer_file = parent_tokenizer(config, tokenizer_file)
    if config.train.parallel == "fsdp":
        raise ConfigError("data.format: preference trains with train.parallel: ddp; under fsdp the frozen "
                          "reference model would still be a whole copy on every process")
    prepared = prepare_preference_data(config.data, tokenizer_file, config.model.block_size, progress=progress,
                                       is_main=is_main)
    reference = reference_for(config, adapters, device, resume=resume)
    return PreferenceTask(fitted(prepared, config), device, reference, config.dpo)
