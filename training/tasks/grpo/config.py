"""The ``rl:`` section of a run's config (``data.format: rl``), and its refusals of settings that
cannot work with GRPO."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.config import ConfigError, Section, require
from data.config import CalculatorShapes
from training.config import Config, MethodSection, register_section
from tools import ToolError, load_tools
from training.tasks.grpo.rewards import BARE_ANSWER, RewardError, reward_function

# Every question is rendered and tokenized when the run starts and held in memory; a million is far
# past any held-out set or a run's epoch of GRPO steps, so more is a typo, refused before the work.
MAX_PROBLEMS = 1_000_000
# Completions per question, sampled and held together (a step decodes batch x group_size rows at
# once, an evaluation batch x eval_samples). GRPO's groups are 4 to 64 (TRL's default 8, DeepSeekMath
# 64); 1024 leaves room for any of them, and a larger group is a typo long before it is a plan.
MAX_GROUP = 1024
# The KL weight: group normalisation keeps the advantages near 1, so at 10 the penalty already
# outweighs the reward tenfold and the policy only holds still; past it a typo such as 1e300 overflows
# the loss, which would then be reported as a divergence the learning rate caused.
MAX_KL_BETA = 10.0
# The sampling temperature. Below 0.1 sampling is nearly greedy: a group's replies agree, their
# advantages are zero and nothing is learned, while the log-probabilities of logits / T reach
# hundreds of nats, where the ratio exp(log π − log π_old) overflows. Above 10 every reply is noise
# over the whole vocabulary.
TEMPERATURES = (0.1, 10.0)
# Calls one reply may make. A reply is one window; each call and its result take a dozen tokens or
# more, so past 16 the window is full long before the limit binds.
MAX_TOOL_CALLS = 16


class ArithmeticConfig(Section):
    """The built-in RL prompts (data/sources/arithmetic.py): distinct questions "What is a+b?" over
    operands 0..max_operand and the ``operations`` named (any of + - *), shuffled by ``seed``;
    ``val_problems`` held out for pass@k, then ``train_problems`` to train on."""

    seed: int = 0
    train_problems: int = Field(2000, ge=1)
    val_problems: int = Field(200, ge=1)
    max_operand: int = Field(99, ge=1)
    operations: str = Field("+", description="distinct characters of +-*")

    @model_validator(mode="after")
    def _drawable(self) -> ArithmeticConfig:
        require(self.operations != "" and set(self.operations) <= set("+-*") and
                len(set(self.operations)) == len(self.operations),
                f"rl.arithmetic.operations must be distinct characters of +-* (got {self.operations!r})")
        require(self.train_problems + self.val_problems <= MAX_PROBLEMS,
                f"rl.arithmetic asks for {self.train_problems + self.val_problems:,} problems, more than the "
                f"{MAX_PROBLEMS:,} a run renders and holds at its start; lower train_problems/val_problems")
        available = len(self.operations) * (self.max_operand + 1) ** 2
        require(self.train_problems + self.val_problems <= available,
                f"rl.arithmetic asks for {self.train_problems + self.val_problems} problems but only {available} "
                f"distinct ones exist; lower train_problems/val_problems or raise max_operand")
        return self


class CalculatorTaskConfig(CalculatorShapes):
    """The built-in prompts with the calculator in the loop (data/sources/tool_arithmetic.py): each
    question of ``data.calculator``'s conversations after the exchanges before it, the plays' among them.
    The same settings draw the same problems in the same order, ``val_problems`` held out first (an SFT
    run's held-out share of as many), and the plays held out as ``data.val_fraction`` and ``split_seed``
    hold them out."""

    train_problems: int = Field(2000, ge=1)
    val_problems: int = Field(200, ge=1)

    @model_validator(mode="after")
    def _drawable(self) -> CalculatorTaskConfig:
        self.check_count("rl.calculator", "train_problems + val_problems", self.train_problems + self.val_problems)
        return self


@register_section("rl")
class RLConfig(MethodSection):
    """Reinforcement learning with verifiable rewards (GRPO, training/tasks/grpo/loss.py), for data.format: rl.

    Each step takes train.batch_size x train.grad_accum_steps prompts (per process), samples
    ``group_size`` completions of each through the engine, scores them with ``rewards`` (names in
    training/tasks/grpo/rewards.py, or module:function) and updates the policy; ``updates_per_batch``
    optimizer steps reuse one sampled batch (TRL's num_iterations). Held-out pass@1 and
    pass@``eval_samples`` are measured at each evaluation.

    ``tools`` (as ``generate.py --tools`` takes them) run inside each rollout, up to ``max_tool_calls``
    calls a reply; ``max_new_tokens`` counts what the model generates over the whole reply."""

    # Advantages compare completions within a group, and a step samples all of them at once.
    group_size: int = Field(8, ge=2, le=MAX_GROUP, description="completions per prompt (TRL's num_generations)")
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, ge=TEMPERATURES[0], le=TEMPERATURES[1], description="the loss's too")
    beta: float = Field(0.04, ge=0, le=MAX_KL_BETA, description="KL penalty to the init_from model (0: none)")
    # The ratio is clipped to [1 - ε, 1 + ε]; at ε >= 1 the lower bound is gone (a ratio is > 0).
    epsilon: float = Field(0.2, gt=0, lt=1)
    updates_per_batch: int = Field(1, ge=1)
    rewards: list[str] = Field(["correct"], min_length=1, description="names in rewards.py, or module:function")
    eval_samples: int = Field(8, ge=1, le=MAX_GROUP, description="completions per held-out prompt: pass@k's k")
    task: Literal["arithmetic", "calculator"] = Field("arithmetic", description="where the prompts come from")
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    calculator: CalculatorTaskConfig = CalculatorTaskConfig()
    tools: list[str] = Field([], description="run inside each rollout (none: the model alone)")
    max_tool_calls: int = Field(4, ge=1, le=MAX_TOOL_CALLS, description="calls one completion may make")

    @model_validator(mode="after")
    def _runnable(self) -> RLConfig:
        try:
            load_tools(self.tools)
        except ToolError as e:
            raise ConfigError(f"rl.tools: {e}") from None
        require(len(set(self.rewards)) == len(self.rewards), f"rl.rewards names one twice: {self.rewards}")
        for name in self.rewards:
            try:
                reward_function(name)
            except RewardError as e:
                raise ConfigError(f"rl.rewards: {e}") from None
        bare = [name for name in self.rewards if name in BARE_ANSWER]
        require(not (self.tools and bare),
                f"rl.rewards: {', '.join(bare)} {'reads' if len(bare) == 1 else 'read'} a reply as a bare answer, "
                "but with rl.tools a reply holds its calls and their results too; use tool_answer_correct (and "
                "tool_format)")
        return self

    @classmethod
    def left_out(cls, config: Config) -> RLConfig | None:
        raise ConfigError("data.format: rl needs an rl section (rl: {} takes every default)")

    def check_run(self, config: Config) -> None:
        require(config.train.parallel == "ddp", "data.format: rl trains with train.parallel: ddp; under fsdp every "
                                                "process would decode its samples with a sliced model")
        require(config.train.compile is not True, "data.format: rl samples through the engine with the plain model; "
                                                  "set train.compile: false")
