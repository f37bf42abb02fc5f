"""What a training run learns from: documents (``TextTask``), conversations (``ChatTask``), reply
pairs to prefer one of (``PreferenceTask``) or questions with checkable answers (``RLTask``).

The loop in ``training/trainer.py`` is the same for both. A task owns what differs: the prepared
data and its batches, how one optimizer step's micro-batches make a loss, the validation score,
the samples shown at each evaluation and what the metrics file keeps of them. ``prepare_task``
is the one place that reads ``data.format``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ContextManager, Protocol

import numpy as np
import torch
from torch import nn

from data import EOT, prepare_data, train_batches
from data.batches.chat import ChatBatches
from data.batches.preference import PreferenceBatches
from data.batches.rl import PromptBatches
from data.chat import ChatTokenIds
from data.prepared.chat import prepare_chat_data
from data.prepared.preference import prepare_preference_data
from data.prepared.prompts import prepare_arithmetic_prompts
from data.sample_prompt import default_sample_prompt
from data.tokenizer import token_byte_table
from inference.engine import decode
from inference.sampling import SamplingSettings
from model.gpt import eval_mode
from training.attention_probe import AttentionProbe, attention_probe
from training.config import Config, ConfigError
from training.distributed import DistContext
from training.device import should_compile
from training.dpo import accumulate_dpo_gradients, evaluate_preferences
from training.evaluate import EvalResult, evaluate, generate_sample
from training.grpo import Rollout, Sampler, accumulate_grpo_gradients, pass_at_k, sample_rollout
from training.interrupt import StopRequest
from training.reference import Reference, reference_for
from training.rewards import correct, reward_function
from training.rng_state import capture_rng_state, restore_rng_state
from training.sft import accumulate_chat_gradients, chat_reply_samples, evaluate_chat

Amp = Callable[[], ContextManager]
Sync = Callable[[bool], ContextManager]
CHAT_SAMPLES = 4  # held-out conversations a chat run replies to at each evaluation


class Batches(Protocol):
    """A training batch sampler: its state is saved with every checkpoint for an exact resume."""

    def next(self) -> tuple[torch.Tensor, torch.Tensor]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def accumulate_gradients(
    model: nn.Module,
    next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    micro_steps: int,
    *,
    amp: Amp | None = None,
    sync: Sync | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> torch.Tensor | None:
    """Forward and backward ``micro_steps`` micro-batches; return their mean loss (detached).

    Each loss is divided by ``micro_steps`` before ``backward`` so the accumulated gradient is the
    gradient of the mean, i.e. that of one batch ``micro_steps`` times larger. ``sync(is_last)``
    lets data-parallel training skip the gradient all-reduce on all but the last micro-batch.
    ``should_stop`` is asked before each micro-batch after the first; when it says yes, the
    step is abandoned half-accumulated and None is returned.
    """
    total = None
    for i in range(micro_steps):
        if i > 0 and should_stop is not None and should_stop():
            return None
        x, y = next_batch()
        with sync(i == micro_steps - 1) if sync is not None else contextlib.nullcontext():
            with amp() if amp is not None else contextlib.nullcontext():
                _, loss = model(x, y)
            (loss / micro_steps).backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total / micro_steps


class Task(ABC):
    """The part of a training run that depends on what it learns from."""

    is_chat: bool
    sample_prompt: str | None  # what text samples continue (None: a chat run replies instead)

    def __init__(self, prepared: Any, device: torch.device) -> None:
        self.prepared = prepared
        self.tokenizer = prepared.tokenizer()
        self.token_bytes = torch.as_tensor(np.asarray(prepared.token_bytes()), dtype=torch.long, device=device)

    @abstractmethod
    def batches(self, batch_size: int, *, seed: int, rank: int, world_size: int, device: torch.device) -> Batches:
        """This process's training batches of ``batch_size`` rows."""

    @abstractmethod
    def accumulate(
        self, model: nn.Module, batches: Batches, micro_steps: int, *, amp: Amp, sync: Sync, ctx: DistContext,
        stop: StopRequest,
    ) -> tuple[torch.Tensor | None, int]:
        """Forward and backward one optimizer step's micro-batches: (the step's loss, tokens
        computed by all processes), or (None, 0) when ``stop`` abandoned the step half-way with
        ``batches`` and the RNGs back where the step found them."""

    @abstractmethod
    def evaluate(self, model: nn.Module, **shared: Any) -> EvalResult:
        """The validation score (``training.evaluate.evaluate``'s keyword arguments in ``shared``)."""

    @abstractmethod
    def samples(self, model: nn.Module, settings: SamplingSettings) -> list[tuple[str, str]]:
        """(prompt, text) rows generated by ``model`` for an evaluation."""

    @abstractmethod
    def sample_fields(self, samples: list[tuple[str, str]]) -> dict[str, Any]:
        """What an evaluation's line in the metrics file keeps of ``samples``."""

    @abstractmethod
    def eval_line(self, scope: str, step: int, result: EvalResult, samples: list[tuple[str, str]]) -> str:
        """The evaluation as the console shows it."""

    def train_fields(self, batches: Batches) -> dict[str, Any]:
        """Fields a training line of the metrics file adds for this task."""
        return {}

    def final_words(self, result: EvalResult) -> str | None:
        """The final evaluation in a few words for the command line, when its loss and bits per
        byte do not say it (None: they do)."""
        return None

    def train_token_count(self) -> int | None:
        """Tokens in the training split, for the epochs a budget covers (None: not counted)."""
        return None

    def describe_batches(self, batches: Batches) -> str | None:
        """A line about the batches said when the run starts, if there is one to say."""
        return None

    def attention_probe(self, block_size: int, device: torch.device) -> AttentionProbe | None:
        """The attention probe of each evaluation, for a task whose validation data has one."""
        return None


def _sample_line(text: str) -> str:
    return "  sample: " + text.replace("\n", "\n          ")


class TextTask(Task):
    """Next-token prediction over documents: every target counts."""

    is_chat = False

    def __init__(self, prepared: Any, config: Config, device: torch.device) -> None:
        super().__init__(prepared, device)
        self.block_size = config.model.block_size
        self.sampling = config.train.sampling
        self.val_tokens = prepared.val_tokens()
        self.sample_prompt = config.eval.sample_prompt
        if self.sample_prompt is None:
            self.sample_prompt = default_sample_prompt(config.data.source, self.tokenizer, self.val_tokens)

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

    def train_token_count(self):
        return len(self.prepared.train_tokens())

    def evaluate(self, model, **shared):
        return evaluate(model, self.val_tokens, self.token_bytes, block_size=self.block_size, **shared)

    def samples(self, model, settings):
        return [(self.sample_prompt, generate_sample(model, self.tokenizer, self.sample_prompt, settings))]

    def sample_fields(self, samples):
        return {"sample": samples[0][1]} if samples else {}

    def eval_line(self, scope, step, result, samples):
        lines = [f"step {step} {scope}: loss {result.loss:.4f} nats/token, {result.bpb:.4f} bits/byte"]
        lines += [_sample_line(text) for _, text in samples[:1]]  # the prompt is part of the text
        return "\n".join(lines)

    def attention_probe(self, block_size, device):
        return attention_probe(self.val_tokens, self.tokenizer, self.sample_prompt, block_size=block_size,
                               skip_id=self.tokenizer.token_to_id(EOT), device=device)


class ChatTask(Task):
    """Supervised fine-tuning on conversations: the loss is the assistant's replies alone."""

    is_chat = True
    sample_prompt = None

    def batches(self, batch_size: int, **placement: Any) -> Batches:
        return ChatBatches(self.prepared.train, batch_size, pad_id=self.prepared.eot_id, **placement)

    def accumulate(self, model, batches, micro_steps, *, amp, sync, ctx, stop):
        # Assistant-only loss over every loss-bearing target of the step, on all ranks together:
        # its count is needed before the first backward, so the step's batches are drawn first.
        micro_batches = [batches.next() for _ in range(micro_steps)]
        loss = accumulate_chat_gradients(model, micro_batches, amp=amp, sync=sync, ctx=ctx)
        return loss, sum(x.numel() for x, _ in micro_batches) * ctx.world_size

    def evaluate(self, model, **shared):
        # Loss and bits/byte of the replies only, over held-out conversations.
        return evaluate_chat(model, self.prepared.val, self.token_bytes, pad_id=self.prepared.eot_id, **shared)

    def samples(self, model, settings):
        end_id = self.tokenizer.token_to_id("<|end|>")
        return chat_reply_samples(model, self.tokenizer, self.prepared.val, end_id, settings, count=CHAT_SAMPLES)

    def sample_fields(self, samples):
        return {"samples": [{"prompt": p, "reply": r} for p, r in samples]}

    def eval_line(self, scope, step, result, samples):
        lines = [f"step {step} {scope}: assistant loss {result.loss:.4f} nats/token, "
                 f"{result.bpb:.4f} bits/byte of assistant text"]
        lines += [_sample_line(prompt + reply) for prompt, reply in samples[:1]]
        return "\n".join(lines)

    def train_fields(self, batches):
        return {"padding_fraction": batches.padding_fraction}

    def describe_batches(self, batches):
        return f"chat batches: {100 * batches.epoch_padding_fraction():.1f}% of computed tokens are padding"


class PreferenceTask(ChatTask):
    """Direct preference optimisation (``training.dpo``) on reply pairs: the model learns to prefer
    each chosen reply over its rejected one, relative to the frozen ``reference``. Its samples are
    replies to held-out prompts, as a chat run's are."""

    def __init__(self, prepared: Any, device: torch.device, reference: Reference, beta: float,
                 rpo_alpha: float = 0.0) -> None:
        super().__init__(prepared, device)
        self.reference = reference
        self.beta = beta
        self.rpo_alpha = rpo_alpha
        self.step_metrics: dict[str, float] = {}  # the last step's, for its line of the metrics file

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

    def eval_line(self, scope, step, result, samples):
        m = result.metrics
        loss = "DPO+RPO loss" if self.rpo_alpha else "DPO loss"
        lines = [f"step {step} {scope}: {loss} {result.loss:.4f}, rewards/accuracies {m['rewards/accuracies']:.3f}, "
                 f"rewards/margins {m['rewards/margins']:.4f}; {result.bpb:.4f} bits/byte of chosen replies"]
        lines += [_sample_line(prompt + reply) for prompt, reply in samples[:1]]
        return "\n".join(lines)

    def train_fields(self, batches):
        metrics = {name: value for name, value in self.step_metrics.items() if name != "loss"}
        return {**metrics, "beta": self.beta, "rpo_alpha": self.rpo_alpha, "padding_fraction": batches.padding_fraction}

    def describe_batches(self, batches):
        return (f"preference batches: {len(self.prepared.train)} training pairs, each a chosen and a rejected row; "
                f"{100 * batches.epoch_padding_fraction():.1f}% of computed tokens are padding")


class RLTask(ChatTask):
    """Reinforcement learning with verifiable rewards (``training.grpo``): each step samples groups
    of replies to training questions through the engine, scores them with the reward functions and
    updates the policy. Its evaluation is held-out pass@1 and pass@k; its samples are replies to
    held-out questions, as a chat run's are."""

    def __init__(self, prepared: Any, config: Config, device: torch.device,
                 reference: Reference | None) -> None:
        super().__init__(prepared, device)
        self.rl = config.rl
        self.device = device
        self.reference = reference
        self.eval_seed = config.eval.sample_seed
        special = ChatTokenIds.of(self.tokenizer)
        self.sampler = Sampler(self.rl.max_new_tokens, self.rl.temperature, special.reply_end_ids,
                               special.suppress_ids, token_byte_table(self.tokenizer),
                               {name: reward_function(name) for name in self.rl.rewards})
        self.step_metrics: dict[str, float] = {}  # the last step's, for its line of the metrics file

    def batches(self, batch_size: int, *, seed: int, rank: int, world_size: int, device: torch.device) -> Batches:
        return PromptBatches(len(self.prepared.train), batch_size, seed=seed, rank=rank, world_size=world_size)

    def accumulate(self, model, batches, micro_steps, *, amp, sync, ctx, stop):
        policy = getattr(model, "module", model)  # DDP's model; the engine decodes with it alone
        if batches.pending is None:
            split = self.prepared.train
            chosen = [i for _ in range(micro_steps) for i in batches.next()]
            # Drawn from the run's generator, which every checkpoint saves: a resumed run samples the same.
            seed = int(torch.randint(2**31 - 1, ()))
            rollout = sample_rollout(
                policy, self.reference, self.sampler, [split.prompts[i] for i in chosen],
                [split.questions[i] for i in chosen], [split.rows[i] for i in chosen], group_size=self.rl.group_size,
                seed=seed, keep_old=self.rl.updates_per_batch > 1, pad_id=self.prepared.eot_id, amp=amp,
            )
            uses_left = self.rl.updates_per_batch - 1
        else:
            rollout = Rollout.from_state(batches.pending, self.device)
            uses_left = batches.pending_uses - 1
        # Kept (and so checkpointed) only while later steps will train on it.
        batches.pending, batches.pending_uses = (rollout.state(), uses_left) if uses_left else (None, 0)
        loss, metrics = accumulate_grpo_gradients(model, rollout, micro_steps, epsilon=self.rl.epsilon,
                                                  beta=self.rl.beta, temperature=self.rl.temperature, amp=amp,
                                                  sync=sync, ctx=ctx)
        self.step_metrics = {**rollout.metrics, **metrics}
        return loss, rollout.x.numel() * ctx.world_size

    def evaluate(self, model, *, batch_size, max_batches, device, amp, ctx, progress):
        val = self.prepared.val
        count = len(val) if max_batches is None else min(len(val), batch_size * max_batches)
        metrics = pass_at_k(model, self.sampler, val.prompts[:count], val.questions[:count], val.rows[:count],
                            correct, k=self.rl.eval_samples, seed=self.eval_seed, batch_size=batch_size, ctx=ctx)
        # The loss an RL evaluation has: the share of held-out samples that fail.
        return EvalResult(loss=1 - metrics["pass@1"], bpb=math.nan, tokens=0, bytes=0, metrics=metrics)

    def samples(self, model, settings):
        val = self.prepared.val
        prompts = val.prompts[:CHAT_SAMPLES]
        settings = dataclasses.replace(settings, suppress_ids=self.sampler.suppress_ids)
        with eval_mode(model):
            finishes = decode(model, prompts, settings, token_bytes=self.sampler.token_bytes,
                              end_ids=self.sampler.end_ids, slide=False)
        return [(self.tokenizer.decode(p, skip_special_tokens=False),
                 self.tokenizer.decode(list(f.token_ids), skip_special_tokens=False)) for p, f in zip(prompts, finishes)]

    def eval_line(self, scope, step, result, samples):
        k = self.rl.eval_samples
        m = result.metrics
        lines = [f"step {step} {scope}: pass@1 {m['pass@1']:.3f}, pass@{k} {m[f'pass@{k}']:.3f} on held-out questions"]
        lines += [_sample_line(prompt + reply) for prompt, reply in samples[:1]]
        return "\n".join(lines)

    def train_fields(self, batches):
        return {**self.step_metrics, "beta": self.rl.beta}

    def final_words(self, result):
        k = self.rl.eval_samples
        return f"held-out pass@1 {result.metrics['pass@1']:.3f}, pass@{k} {result.metrics[f'pass@{k}']:.3f}"

    def describe_batches(self, batches):
        return (f"rl: {len(self.prepared.train)} training and {len(self.prepared.val)} held-out questions; "
                f"{self.rl.group_size} completions of each prompt, rewards {', '.join(self.rl.rewards)}")


def prepare_task(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool,
                 device: torch.device) -> Task:
    """The task ``data.format`` names, its data prepared (``tokenizer_file``: a parent run's
    tokenizer, or the run's own copy when resuming; None trains one for a text run) and checked
    to fit the model."""
    fmt = config.data.format
    if fmt != "text" and tokenizer_file is None:
        raise ConfigError(f"data.format: {fmt} fine-tunes a trained run: set train.init_from to its directory")
    if fmt == "preference" and config.train.parallel == "fsdp":
        raise ConfigError("data.format: preference trains with train.parallel: ddp; under fsdp the frozen "
                          "reference model would still be a whole copy on every process")
    if fmt == "rl" and should_compile(config.train.compile, device):
        raise ConfigError("data.format: rl samples through the engine with the plain model; set train.compile: false")
    if fmt == "chat":
        prepared = prepare_chat_data(config.data, tokenizer_file, config.model.block_size, progress=progress,
                                     is_main=is_main)
    elif fmt == "preference":
        prepared = prepare_preference_data(config.data, tokenizer_file, config.model.block_size, progress=progress,
                                           is_main=is_main)
    elif fmt == "rl":
        prepared = prepare_arithmetic_prompts(tokenizer_file, **vars(config.rl.arithmetic))
    else:
        prepared = prepare_data(config.data, progress=progress, is_main=is_main, tokenizer_file=tokenizer_file)
    prepared.check_block_size(config.model.block_size)
    if prepared.vocab_size > config.model.vocab_size:
        raise ConfigError(
            f"the tokenizer has {prepared.vocab_size} tokens but model.vocab_size is "
            f"{config.model.vocab_size}; remove model.vocab_size or raise it"
        )
    if fmt == "chat":
        return ChatTask(prepared, device)
    if fmt == "preference":
        return PreferenceTask(prepared, device, reference_for(config, device), config.train.dpo_beta,
                              config.train.dpo_rpo_alpha)
    if fmt == "rl":  # no reference where the KL penalty is off
        return RLTask(prepared, config, device, reference_for(config, device) if config.rl.beta > 0 else None)
    return TextTask(prepared, config, device)
