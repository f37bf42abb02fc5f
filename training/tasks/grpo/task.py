"""The RL task (``data.format: rl``): GRPO with verifiable rewards, on questions with checkable answers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.errors import DataError
from data.chat import ChatTokenIds
from data.tokenizer import token_byte_table
from tools import Toolbox, load_tools
from training.adapters import Adapters
from training.config import Config, ConfigError
from training.device import should_compile
from training.evaluate import EvalResult
from training.result import Words
from training.tasks.chat import CHAT_SAMPLES, ChatTask
from training.tasks.grpo.loss import Rollout, accumulate_grpo_gradients
from training.tasks.grpo.prompts import prepare_arithmetic_prompts, prepare_calculator_prompts
from training.tasks.grpo.rewards import correct, needs_tool, reward_function, tool_answer_correct, tool_when_needed
from training.tasks.grpo.rollout import Questions, Sampler, ToolLoop, pass_at_k, sample_rollout
from training.tasks.reference import Reference, reference_for
from training.tasks.task import Batches, fitted, parent_tokenizer


class RLTask(ChatTask):
    """Evaluated by held-out pass@1 and pass@k; its samples are replies to held-out questions."""

    def __init__(self, prepared: Any, config: Config, device: torch.device,
                 reference: Reference | None) -> None:
        super().__init__(prepared, device)
        self.rl = config.rl
        self.device = device
        self.reference = reference
        self.eval_seed = config.eval.sample_seed
        # A question of the kind it learned to answer (not a speech of the plays).
        self.sample_prompt = next(q for q, row in zip(prepared.val.questions, prepared.val.rows) if needs_tool(row))
        special = ChatTokenIds.of(self.tokenizer)
        tools = None
        if self.rl.tools:
            special.require_tools()
            # Its worker process starts at the first call and stops when the run's process ends.
            tools = ToolLoop(self.tokenizer, Toolbox(load_tools(self.rl.tools)), self.rl.max_tool_calls, special.call)
        # A reply offered no tools never samples <|call|> (the chat format's rule).
        self.sampler = Sampler(self.rl.max_new_tokens, self.rl.temperature, special.reply_end_ids,
                               special.reply_suppress_ids(tools is not None), token_byte_table(self.tokenizer),
                               {name: reward_function(name) for name in self.rl.rewards}, tools)
        # What held-out pass@k counts: the answer, after any calls.
        self.passed = tool_answer_correct if tools is not None else correct
        self.step_metrics: dict[str, float] = {}  # the last step's, for its line of the metrics file
        k = self.rl.eval_samples
        self.words = Words(
            eval=f"pass@1 {{pass@1:.3f}}, pass@{k} {{pass@{k}:.3f}} on held-out questions",
            final=f"held-out pass@1 {{pass@1:.3f}}, pass@{k} {{pass@{k}:.3f}}", kept_by="held-out pass@1",
            kept="{passed:.3f}", batches=f"rl: {len(prepared.train)} training and {len(prepared.val)} held-out "
            f"questions; {self.rl.group_size} completions of each prompt, rewards {', '.join(self.rl.rewards)}")
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

        def measured(indices: list[int], passed: Any, seed: int) -> dict[str, float]:
            chosen = indices if max_batches is None else indices[:batch_size * max_batches]
            return pass_at_k(model, self.sampler, [val.prompts[i] for i in chosen], [val.questions[i] for i in chosen],
                             [val.rows[i] for i in chosen], passed, k=self.rl.eval_samples, seed=seed,
                             batch_size=batch_size, ctx=ctx)

        # pass@k counts the questions that need a tool; the plays' speeches count the calls made where none is.
        asked = [i for i, row in enumerate(val.rows) if needs_tool(row)]
        metrics = measured(asked, self.passed, self.eval_seed)
        spoken = [i for i, row in enumerate(val.rows) if not needs_tool(row)]
        if spoken:
            metrics["tools/unneeded_call_ratio"] = 1 - measured(spoken, tool_when_needed, self.eval_seed + 1)["pass@1"]
        # The loss an RL evaluation has: the share of held-out samples that fail.
        return EvalResult(loss=1 - metrics["pass@1"], bpb=math.nan, tokens=0, bytes=0, metrics=metrics)

    def samples(self, model, settings):
        val = self.prepared.val
        prompts = [list(p) for p in val.prompts[:CHAT_SAMPLES]]
        settings = dataclasses.replace(settings, suppress_ids=self.sampler.suppress_ids)
        completions = self.sampler.decode(model, prompts, settings)  # with the tools, when the run has them
        return [(self.tokenizer.decode(p, skip_special_tokens=False),
                 self.tokenizer.decode(c.ids, skip_special_tokens=False)) for p, c in zip(prompts, completions)]

    def train_fields(self, batches):
        return {**self.step_metrics, "beta": self.rl.beta}

    def state_dict(self):
        return {"pending": self.pending, "pending_uses": self.pending_uses}

    def load_state_dict(self, state):
        self.pending, self.pending_uses = state.get("pending"), int(state.get("pending_uses", 0))

    def final_metrics(self, model):
        return {}  # pass@k is the evaluation itself

    def steps_per_epoch(self, rows_per_step):
        return None  # a batch of questions serves rl.updates_per_batch steps: not counted


def build(config: Config, tokenizer_file: Path | None, *, progress: bool, is_main: bool, device: torch.device,
          adapters: Adapters, resume: bool = False) -> RLTask:
    """The built-in questions rendered with the parent run's tokenizer, and the parent as the frozen
    reference of the KL penalty (none where ``rl.beta`` is 0)."""
    tokenizer_file = parent_tokenizer(config, tokenizer_file)
    if should_compile(config.train.compile, device):
        raise ConfigError("data.format: rl samples through the engine with the plain model; set train.compile: false")
    if config.rl.task == "calculator":
        calc = config.rl.calculator
        prompts = prepare_calculator_prompts(tokenizer_file, calc, train_problems=calc.train_problems,
                                             val_problems=calc.val_problems, val_fraction=config.data.val_fraction,
                                             split_seed=config.data.split_seed, window=config.model.block_size,
                                             reply=config.rl.max_new_tokens)
    else:
        prompts = prepare_arithmetic_prompts(tokenizer_file, **vars(config.rl.arithmetic))
    prepared = fitted(prompts, config)
    reference = reference_for(config, adapters, device, resume=resume) if config.rl.beta > 0 else None
    return RLTask(prepared, config, device, reference)


@dataclasses.dataclass(frozen=True)
class PromptDraw:
    """This rank's share of a draw: the prompts' indices, and the seed of the first prompt's first
    completion (prompt i's completion g is sampled from ``seed + i x copies + g``)."""

    indices: list[int]
    seed: int


class PromptBatches:
    """Shuffled draws of training prompt indices, every prompt once per epoch.

    Each epoch shuffles the training prompts by (seed, epoch) alone, so every rank agrees on the order
    and a resumed run continues it exactly; rank r takes the r-th ``batch_size`` prompts of each draw
    of ``batch_size x world_size``. A draw is a list of prompt indices: the task samples the
    completions itself (they need the model), and keeps the sampled batch that later updates reuse.
    Completion g of the prompt at place k of the epoch's order is sampled from ``epoch seed + k x
    copies + g``: a completion's seed depends on the prompt's place alone, not on the process that
    draws it nor on how the step is cut into micro-batches, so several processes sample exactly what
    one process would.
    """

    def __init__(self, count: int, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1,
                 copies: int = 1) -> None:
        self.count, self.batch_size, self.copies = count, batch_size, copies
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.draw_size = batch_size * world_size
        if count < self.draw_size:
            raise DataError(f"the rl task has {count} training prompts, fewer than one batch of {self.draw_size}: "
                            "lower train.batch_size or raise rl.arithmetic.train_problems")
        self.epoch = 0
        self.position = 0  # draws of this epoch already taken

    def next(self) -> PromptDraw:
        """This rank's prompts of the next draw, and the seed of their completions."""
        draws = self.count // self.draw_size
        if self.position >= draws:
            self.epoch, self.position = self.epoch + 1, 0
        order = np.random.default_rng([self.seed, self.epoch]).permutation(self.count)
        start = self.position * self.draw_size + self.rank * self.batch_size
        self.position += 1
        # A stream of its own (the third word), apart from the order's.
        epoch_seed = int(np.random.default_rng([self.seed, self.epoch, 1]).integers(2**31))
        return PromptDraw(order[start:start + self.batch_size].tolist(), epoch_seed + start * self.copies)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
