"""The RL task (``data.format: rl``): GRPO with verifiable rewards, on questions with checkable answers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from data.chat import ChatTokenIds
from data.tokenizer import token_byte_table
from inference.engine import decode
from model.gpt import eval_mode
from training.adapters import Adapters
from training.config import Config, ConfigError
from training.device import should_compile
from training.evaluate import EvalResult
from training.tasks.chat import CHAT_SAMPLES, ChatTask
from training.tasks.grpo.batches import PromptBatches
from training.tasks.grpo.loss import Rollout, accumulate_grpo_gradients
from training.tasks.grpo.prompts import prepare_arithmetic_prompts
from training.tasks.grpo.rewards import correct, reward_function
from training.tasks.grpo.rollout import Questions, Sampler, pass_at_k, sample_rollout
from training.tasks.reference import Reference, reference_for
from training.tasks.task import Batches, fitted, parent_tokenizer, sample_line


class RLTask(ChatTask):
    """Reinforcement learning with verifiable rewards (``training.tasks.grpo.loss``): each step samples groups
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
        self.sample_prompt = prepared.val.questions[0]  # a question of the kind it learned to answer
        special = ChatTokenIds.of(self.tokenizer)
        self.sampler = Sampler(self.rl.max_new_tokens, self.rl.temperature, special.reply_end_ids,
                               special.suppress_ids, token_byte_table(self.tokenizer),
                               {name: reward_function(name) for name in self.rl.rewards})
        self.step_metrics: dict[str, float] = {}  # the last step's, for its line of the metrics file
        # The sampled batch later updates reuse (``rl.updates_per_batch`` > 1), as plain tensors, and
        # the steps it still serves: a checkpoint between those updates must carry it.
        self.pending: dict[str, Any] | None = None
        self.pending_uses = 0

    def batches(self, batch_size: int, *, seed: int, rank: int, world_size: int, device: torch.device) -> Batches:
        return PromptBatches(len(self.prepared.train), batch_size, seed=seed, rank=rank, world_size=world_size,
                             copies=self.rl.group_size)

    def accumulate(self, model, batches, micro_steps, *, amp, sync, ctx, stop):
        policy = getattr(model, "module", model)  # DDP's model; the engine decodes with it alone
        if self.pending is None:
            split = self.prepared.train
            draws = [batches.next() for _ in range(micro_steps)]
            questions = [Questions([split.prompts[i] for i in draw.indices], [split.questions[i] for i in draw.indices],
                                   [split.rows[i] for i in draw.indices], draw.seed) for draw in draws]
            rollout = sample_rollout(policy, self.reference, self.sampler, questions, group_size=self.rl.group_size,
                                     keep_old=self.rl.updates_per_batch > 1, pad_id=self.prepared.eot_id, amp=amp,
                                     ctx=ctx)
            uses_left = self.rl.updates_per_batch - 1
        else:
            rollout = Rollout.from_state(self.pending, self.device)
            uses_left = self.pending_uses - 1
        # Kept (and so checkpointed) only while later steps will train on it.
        self.pending, self.pending_uses = (rollout.state(), uses_left) if uses_left else (None, 0)
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
        lines += [sample_line(prompt + reply) for prompt, reply in samples[:1]]
        return "\n".join(lines)

    def train_fields(self, batches):
        return {**self.step_metrics, "beta": self.rl.beta}

    def state_dict(self):
        return {"pending": self.pending, "pending_uses": self.pending_uses}

    def load_state_dict(self, state):
        self.pending, self.pending_uses = state.get("pending"), int(state.get("pending_uses", 0))

    def final_words(self, result):
        k = self.rl.eval_samples
        return f"held-out pass@1 {result.metrics['pass@1']:.3f}, pass@{k} {result.metrics[f'pass@{k}']:.3f}"

    kept_by = "held-out pass@1"

    def kept_score(self, loss):
        return f"{1 - loss:.3f}"  # the evaluation's loss is the share of samples that fail

    def final_metrics(self, model):
        return {}  # pass@k is the evaluation itself

    def steps_per_epoch(self, rows_per_step):
        return None  # a batch of questions serves rl.updates_per_batch steps: not counted

    def describe_batches(self, batches):
        return (f"rl: {len(self.prepared.train)} training and {len(self.prepared.val)} held-out questions; "
                f"{self.rl.group_size} completions of each prompt, rewards {', '.join(self.rl.rewards)}")


def build(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool, device: torch.device,
          adapters: Adapters, resume: bool = False) -> RLTask:
    """The built-in questions rendered with the parent run's tokenizer, and the parent as the frozen
    reference of the KL penalty (none where ``rl.beta`` is 0)."""
    tokenizer_file = parent_tokenizer(config, tokenizer_file)
    if should_compile(config.train.compile, device):
        raise ConfigError("data.format: rl samples through the engine with the plain model; set train.compile: false")
    prepared = fitted(prepare_arithmetic_prompts(tokenizer_file, **vars(config.rl.arithmetic)), config)
    reference = reference_for(config, adapters, device, resume=resume) if config.rl.beta > 0 else None
    return RLTask(prepared, config, device, reference)
