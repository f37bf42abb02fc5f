"""The ``rl:`` section of a run's config (``data.format: rl``), and its refusals of settings that
cannot work with GRPO."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common.config import ConfigError, check_types, require, require_in
from training.tasks.grpo.rewards import RewardError, reward_function

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


@dataclass
class ArithmeticConfig:
    """The built-in RL prompts (data/sources/arithmetic.py): distinct questions "What is a+b?" over
    operands 0..max_operand and the ``operations`` named (any of + - *), shuffled by ``seed``;
    ``val_problems`` held out for pass@k, then ``train_problems`` to train on."""

    seed: int = 0
    train_problems: int = 2000
    val_problems: int = 200
    max_operand: int = 99
    operations: str = "+"

    def __post_init__(self) -> None:
        check_types(self, "rl.arithmetic")
        require(self.train_problems >= 1 and self.val_problems >= 1,
                "rl.arithmetic.train_problems and val_problems must be >= 1")
        require(self.train_problems + self.val_problems <= MAX_PROBLEMS,
                f"rl.arithmetic asks for {self.train_problems + self.val_problems:,} problems, more than the "
                f"{MAX_PROBLEMS:,} a run renders and holds at its start; lower train_problems/val_problems")
        require(self.max_operand >= 1, f"rl.arithmetic.max_operand must be >= 1 (got {self.max_operand})")
        require(self.operations != "" and set(self.operations) <= set("+-*") and
                len(set(self.operations)) == len(self.operations),
                f"rl.arithmetic.operations must be distinct characters of +-* (got {self.operations!r})")
        available = len(self.operations) * (self.max_operand + 1) ** 2
        require(self.train_problems + self.val_problems <= available,
                f"rl.arithmetic asks for {self.train_problems + self.val_problems} problems but only {available} "
                f"distinct ones exist; lower train_problems/val_problems or raise max_operand")


@dataclass
class RLConfig:
    """Reinforcement learning with verifiable rewards (GRPO, training/tasks/grpo/loss.py), for data.format: rl.

    Each step takes train.batch_size x train.grad_accum_steps prompts (per process), samples
    ``group_size`` completions of each through the engine, scores them with ``rewards`` (names in
    training/tasks/grpo/rewards.py, or module:function) and updates the policy; ``updates_per_batch``
    optimizer steps reuse one sampled batch (TRL's num_iterations). Held-out pass@1 and
    pass@``eval_samples`` are measured at each evaluation."""

    group_size: int = 8  # completions per prompt (TRL's num_generations)
    max_new_tokens: int = 8
    temperature: float = 1.0  # sampling temperature; the loss's log-probabilities use the same
    beta: float = 0.04  # weight of the KL penalty to the frozen init_from model (0: none)
    epsilon: float = 0.2  # the ratio's clip range, [1 - epsilon, 1 + epsilon]
    updates_per_batch: int = 1
    rewards: list[str] = field(default_factory=lambda: ["correct"])
    eval_samples: int = 8  # completions per held-out prompt: the k of pass@k
    task: str = "arithmetic"  # where the prompts come from (the one built-in task)
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig)

    def __post_init__(self) -> None:
        check_types(self, "rl")
        require(self.group_size >= 2, f"rl.group_size must be >= 2: advantages compare completions within a group "
                                      f"(got {self.group_size})")
        require(self.group_size <= MAX_GROUP, f"rl.group_size must be at most {MAX_GROUP}: a step samples every "
                                              f"completion of its questions at once (got {self.group_size:,})")
        require(self.max_new_tokens >= 1, f"rl.max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        require_in(self.temperature, "rl.temperature", *TEMPERATURES)
        require_in(self.beta, "rl.beta", 0, MAX_KL_BETA, note=" (0: no KL penalty)")
        # The ratio is clipped to [1 - ε, 1 + ε]; at ε >= 1 the lower bound is gone (a ratio is > 0).
        require_in(self.epsilon, "rl.epsilon", 0, 1, low_open=True, high_open=True)
        require(self.updates_per_batch >= 1, f"rl.updates_per_batch must be >= 1 (got {self.updates_per_batch})")
        require(1 <= self.eval_samples <= MAX_GROUP,
                f"rl.eval_samples must be 1 to {MAX_GROUP}: each held-out question's samples are decoded at once "
                f"(got {self.eval_samples:,})")
        require(self.task == "arithmetic", f"rl.task must be arithmetic, the one built-in task (got {self.task!r})")
        require(bool(self.rewards), "rl.rewards is empty; name at least one, e.g. [correct]")
        require(len(set(self.rewards)) == len(self.rewards), f"rl.rewards names one twice: {self.rewards}")
        for name in self.rewards:
            try:
                reward_function(name)
            except RewardError as e:
                raise ConfigError(f"rl.rewards: {e}") from None




def check_rl_run(config: Any) -> None:
    """The rl section goes with data.format: rl, and a setting that cannot work is refused (called by
    ``training.config.Config`` with the whole config)."""
    rl, train = config.rl, config.train
    if config.data.format != "rl":
        require(rl is None, f"an rl section is for data.format: rl (this run's is {config.data.format})")
        return
    require(rl is not None, "data.format: rl needs an rl section (rl: {} takes every default)")
    require(train.parallel == "ddp", "data.format: rl trains with train.parallel: ddp; under fsdp every process "
                                     "would decode its samples with a sliced model")
    require(train.compile is not True, "data.format: rl samples through the engine with the plain model; "
                                       "set train.compile: false")
