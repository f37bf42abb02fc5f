"""GRPO's sampling: a group of completions of each prompt through the engine, scored by the reward
functions into a ``Rollout`` (``training.tasks.grpo.loss``) that the updates train on; and the
held-out pass@k an RL run is evaluated by."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from inference.engine import decode
from inference.sampling import SamplingSettings
from model.gpt import eval_mode
from training.distributed import DistContext, all_gather_rows, all_reduce_sum, shared_failure
from training.tasks.grpo.loss import Amp, Rollout, group_advantages, target_logps
from training.tasks.grpo.rewards import Reward, RewardFunction
from training.tasks.reference import Reference


def collate_completions(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad_id: int,
                        device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of prompt + completion rows, right-padded: y holds the completion's tokens alone."""
    width = max(len(p) + len(c) for p, c in zip(prompts, completions)) - 1
    x = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    y = torch.full((len(prompts), width), -1, dtype=torch.long)
    for r, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids = torch.tensor([*prompt, *completion])
        n = len(ids) - 1
        x[r, :n] = ids[:-1]
        y[r, len(prompt) - 1:n] = ids[len(prompt):]
    return x.to(device), y.to(device)


@dataclass(frozen=True)
class Sampler:
    """How an RL run samples and scores: the engine's settings less the seed, the reply's end
    tokens, the tokenizer's bytes (for the text a reward reads) and the reward functions."""

    max_new_tokens: int
    temperature: float
    end_ids: tuple[int, ...]
    suppress_ids: tuple[int, ...]
    token_bytes: Sequence[bytes]
    rewards: dict[str, Reward]

    def settings(self, seed: int) -> SamplingSettings:
        # No top-k or top-p: the loss's log-probabilities are those of the distribution sampled.
        return SamplingSettings(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=None,
                                top_p=None, seed=seed, suppress_ids=self.suppress_ids)

    def complete(self, policy: nn.Module, prompts: Sequence[Sequence[int]], copies: int,
                 seed: int) -> list[tuple[list[int], str, bool]]:
        """(token ids, text, ended) of ``copies`` completions of each prompt, group after group,
        completion i seeded ``seed + i`` (the engine's rule): one batch of rows."""
        rows = [list(p) for p in prompts for _ in range(copies)]
        with eval_mode(policy):
            finishes = decode(policy, rows, self.settings(seed), token_bytes=self.token_bytes, end_ids=self.end_ids,
                              slide=False)
        return [(list(f.token_ids), f.text, f.reason == "stop") for f in finishes]

    def score(self, questions: Sequence[str], rows: Sequence[dict[str, Any]], texts: Sequence[str],
              copies: int) -> torch.Tensor:
        """(completions, reward functions) scores; completion i answers question i // copies. A
        reward that fails raises a RewardError naming it and the question."""
        rewards = self.rewards.values()
        return torch.tensor([[reward(questions[i // copies], text, rows[i // copies]) for reward in rewards]
                             for i, text in enumerate(texts)], dtype=torch.float32)


@dataclass(frozen=True)
class Questions:
    """One micro-batch of training questions: their prompts (token ids), texts and rows, and the seed
    of the first one's first completion (``training.tasks.grpo.batches.PromptDraw``)."""

    prompts: list[list[int]]
    texts: list[str]
    rows: list[dict[str, Any]]
    seed: int


@torch.no_grad()
def sample_rollout(
    policy: nn.Module, reference: Reference | None, sampler: Sampler, batches: Sequence[Questions], *,
    group_size: int, keep_old: bool, pad_id: int, amp: Amp | None = None, ctx: DistContext = DistContext(),
) -> Rollout:
    """Sample ``group_size`` completions of every question, one micro-batch of ``batches`` at a time
    (the rows the update later computes together), score them and compute what the updates need:
    advantages, and (in eval mode, without gradients) the reference's log-probabilities and, for
    several updates, the sampling policy's. A reward's failure on any process stops every process.
    The metrics carry TRL's names and cover the rows of every process."""
    device = next(policy.parameters()).device
    completions = [done for part in batches for done in sampler.complete(policy, part.prompts, group_size, part.seed)]
    questions = [text for part in batches for text in part.texts]
    rows = [row for part in batches for row in part.rows]
    texts = [text for _, text, _ in completions]
    scores = shared_failure(ctx, lambda: sampler.score(questions, rows, texts, group_size))
    advantages, _ = group_advantages(scores.sum(dim=1), group_size)
    grouped_prompts = [p for part in batches for p in part.prompts for _ in range(group_size)]
    x, y = collate_completions(grouped_prompts, [ids for ids, _, _ in completions], pad_id, device)
    old = ref = None
    if keep_old or reference is not None:
        # In the micro-batches the updates use, so no pass holds more rows than an update does.
        old_parts, ref_parts = [], []
        with eval_mode(policy), amp() if amp is not None else contextlib.nullcontext():
            for chunk in torch.arange(len(x), device=device).tensor_split(len(batches)):
                if keep_old:
                    old_parts.append(target_logps(policy(x[chunk]), y[chunk], sampler.temperature))
                if reference is not None:
                    ref_parts.append(target_logps(reference.logits(policy, x[chunk]), y[chunk], sampler.temperature))
        old = torch.cat(old_parts) if keep_old else None
        ref = torch.cat(ref_parts) if reference is not None else None
    lengths = torch.tensor([len(ids) for ids, _, _ in completions], dtype=torch.float32)
    ended = torch.tensor([float(stopped) for _, _, stopped in completions])
    gathered = [all_gather_rows(values.to(device), ctx).cpu() for values in (scores, lengths, ended)]
    metrics = rollout_metrics(*gathered, list(sampler.rewards), group_size)
    return Rollout(x, y, advantages.to(device), old, ref, metrics)


def rollout_metrics(scores: torch.Tensor, lengths: torch.Tensor, ended: torch.Tensor, names: list[str],
                    group_size: int) -> dict[str, float]:
    """TRL's rollout metrics from every completion's ``scores`` (one column per reward function),
    length and whether it ended, laid out group after group."""
    rewards = scores.sum(dim=1)
    _, std = group_advantages(rewards, group_size)
    return {
        "reward": rewards.mean().item(),
        "reward_std": std.mean().item(),
        "frac_reward_zero_std": (std.view(-1, group_size)[:, 0] < 1e-6).float().mean().item(),
        **{f"rewards/{name}/mean": scores[:, j].mean().item() for j, name in enumerate(names)},
        **{f"rewards/{name}/std": scores[:, j].std().item() for j, name in enumerate(names)},
        "completions/mean_length": lengths.mean().item(),
        "completions/min_length": lengths.min().item(),
        "completions/max_length": lengths.max().item(),
        # Completions cut at max_new_tokens (or the window) before their end token.
        "completions/clipped_ratio": 1 - ended.mean().item(),
    }


# --------------------------------------------------------------------------------------------
# Held-out pass@k


@torch.no_grad()
def pass_at_k(
    policy: nn.Module, sampler: Sampler, prompts: Sequence[Sequence[int]], questions: Sequence[str],
    rows: Sequence[dict[str, Any]], passed: RewardFunction, *, k: int, seed: int, batch_size: int,
    ctx: DistContext = DistContext(),
) -> dict[str, float]:
    """``pass@1`` (the share of the k samples that pass, the unbiased estimate from k) and
    ``pass@k`` (the share of prompts with at least one passing sample) over ``prompts``, and the
    mean completion length. Sample j of prompt i is seeded ``seed + i·k + j`` whatever the
    batching; with several processes each takes every ``world_size``-th batch of ``batch_size``."""
    sums = torch.zeros(4, dtype=torch.float64)  # prompts, passing samples, prompts passed, tokens
    for b, start in enumerate(range(0, len(prompts), batch_size)):
        if b % ctx.world_size != ctx.rank:
            continue
        chunk = range(start, min(start + batch_size, len(prompts)))
        completions = sampler.complete(policy, [prompts[i] for i in chunk], k, seed + start * k)
        for n, i in enumerate(chunk):
            group = completions[n * k:(n + 1) * k]
            passes = sum(passed(questions[i], text, rows[i]) >= 1.0 for _, text, _ in group)
            sums += torch.tensor([1.0, passes, float(passes > 0), sum(len(ids) for ids, _, _ in group)],
                                 dtype=torch.float64)
    device = next(policy.parameters()).device
    count, passes, solved, tokens = all_reduce_sum(sums.to(device), ctx).tolist()
    count = max(count, 1.0)
    return {"pass@1": passes / (count * k), f"pass@{k}": solved / count,
            "completions/mean_length": tokens / (count * k)}
