"""GRPO's sampling: a group of completions of each prompt through the engine, scored by the reward
functions into a ``Rollout`` (``training.tasks.grpo.loss``) that the updates train on; and the
held-out pass@k an RL run is evaluated by.

With tools (``rl.tools``), a completion is a multi-turn reply (``inference.tool_use.decode_with_tools``)
whose ids interleave what the model sampled with the inserted results; only the sampled ids are loss
targets, since a gradient on a tool's output would push the model towards text it never chose.
Completion i is seeded ``seed + i`` and a tool call is deterministic, so a completion is the same on
any process."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from tokenizers import Tokenizer
from torch import nn

from inference.engine import Engine, decode
from inference.sampling import SamplingSettings
from inference.tool_use import ToolReply, decode_with_tools
from model.gpt import eval_mode
from tools import Toolbox
from training.distributed import DistContext, all_gather_rows, all_reduce_sum, shared_failure
from training.tasks.grpo.loss import Amp, Rollout, group_advantages, target_logps
from training.tasks.grpo.rewards import Reward, RewardFunction
from training.tasks.reference import Reference


def collate_completions(prompts: Sequence[Sequence[int]], completions: Sequence[Completion], pad_id: int,
                        device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of prompt + completion rows, right-padded: y holds the tokens of the completion the
    model generated, and −1 elsewhere (the prompt, the padding, and what a tool inserted)."""
    width = max(len(p) + len(c.ids) for p, c in zip(prompts, completions)) - 1
    x = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    y = torch.full((len(prompts), width), -1, dtype=torch.long)
    for r, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids = torch.tensor([*prompt, *completion.ids])
        n = len(ids) - 1
        x[r, :n] = ids[:-1]
        targets = ids[len(prompt):]
        y[r, len(prompt) - 1:n] = torch.where(torch.tensor(completion.generated, dtype=torch.bool), targets, -1)
    return x.to(device), y.to(device)


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its ids after the prompt, which of them the model generated, its text
    as the rewards read it, whether it ended its turn, and with tools its calls begun, run and failed."""

    ids: list[int]
    generated: list[bool]
    text: str
    ended: bool
    calls_begun: int = 0
    calls_run: int = 0
    calls_failed: int = 0

    @property
    def length(self) -> int:
        """The tokens the model generated."""
        return sum(self.generated)


@dataclass(frozen=True)
class ToolLoop:
    """The tools a run's completions call (``rl.tools``), run by ``toolbox`` at most ``max_calls``
    times a reply, and the tokenizer the calls are read with."""

    tokenizer: Tokenizer
    toolbox: Toolbox
    max_calls: int
    call_id: int  # <|call|>

    def decode(self, policy: nn.Module, rows: list[list[int]], settings: SamplingSettings,
               token_bytes: Sequence[bytes], end_ids: Sequence[int]) -> list[Completion]:
        # The engine inference.engine.decode would build: a row per completion, each prompt encoded in one pass.
        engine = Engine(policy, token_bytes, max_batch=len(rows), max_queue=0,
                        prefill_chunk=policy.config.block_size, batch_invariant=False)
        replies = decode_with_tools(engine, self.tokenizer, rows, settings, self.toolbox, max_calls=self.max_calls,
                                    slide=False)
        return [self.completion(reply, end_ids, policy.config.block_size) for reply in replies]

    def completion(self, reply: ToolReply, end_ids: Sequence[int], block_size: int) -> Completion:
        """A reply as a completion: its text in the chat format without the closing end token, its
        ids cut to the loss's window (only inserted ids ever are; the rewards still read all)."""
        ended = reply.finish_reason in ("stop", "malformed")  # malformed: a turn ended on a call that does not parse
        shown = reply.ids[:-1] if ended and reply.ids and reply.ids[-1] in end_ids else reply.ids
        begun = sum(token == self.call_id for token, sampled in zip(reply.ids, reply.generated) if sampled)
        kept = block_size + 1 - len(reply.prompt_ids)  # the rows' inputs are prompt + ids less the last
        assert not any(reply.generated[kept:]), "the engine never generates past the window"
        return Completion(reply.ids[:kept], reply.generated[:kept], self.tokenizer.decode(shown, skip_special_tokens=False),
                          ended, begun, len(reply.steps), sum(not step.result.ok for step in reply.steps))


@dataclass(frozen=True)
class Sampler:
    """How an RL run samples and scores: the engine's settings less the seed, end tokens, the
    tokenizer's bytes, the reward functions, and the tools run inside each completion (or None)."""

    max_new_tokens: int
    temperature: float
    end_ids: tuple[int, ...]
    suppress_ids: tuple[int, ...]
    token_bytes: Sequence[bytes]
    rewards: dict[str, Reward]
    tools: ToolLoop | None = None

    def settings(self, seed: int) -> SamplingSettings:
        # No top-k or top-p: the loss's log-probabilities are those of the distribution sampled.
        return SamplingSettings(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=None,
                                top_p=None, seed=seed, suppress_ids=self.suppress_ids)

    def complete(self, policy: nn.Module, prompts: Sequence[Sequence[int]], copies: int, seed: int) -> list[Completion]:
        """``copies`` completions of each prompt, group after group, completion i seeded ``seed + i``
        (the engine's rule): one batch of rows."""
        return self.decode(policy, [list(p) for p in prompts for _ in range(copies)], self.settings(seed))

    def decode(self, policy: nn.Module, rows: list[list[int]], settings: SamplingSettings) -> list[Completion]:
        """A completion of each row, sampled with ``settings``, with the run's tools if it has them."""
        with eval_mode(policy):
            if self.tools is not None:
                return self.tools.decode(policy, rows, settings, self.token_bytes, self.end_ids)
            finishes = decode(policy, rows, settings, token_bytes=self.token_bytes, end_ids=self.end_ids, slide=False)
        return [Completion(list(f.token_ids), [True] * len(f.token_ids), f.text, f.reason == "stop") for f in finishes]

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
    of the first one's first completion (``training.tasks.grpo.task.PromptDraw``)."""

    prompts: list[list[int]]
    texts: list[str]
    rows: list[dict[str, Any]]
    seed: int


@torch.no_grad()
def sample_rollout(
    policy: nn.Module, reference: Reference | None, sampler: Sampler, batches: Sequence[Questions], *,
    group_size: int, keep_old: bool, pad_id: int, amp: Amp | None = None, ctx: DistContext = DistContext(),
) -> Rollout:
    """Sample ``group_size`` completions of every question, one micro-batch at a time, score them and
    compute what the updates need: advantages, the reference's log-probabilities and, for several
    updates, the sampling policy's. A reward's failure on any process stops every process."""
    device = next(policy.parameters()).device
    completions = [done for part in batches for done in sampler.complete(policy, part.prompts, group_size, part.seed)]
    questions = [text for part in batches for text in part.texts]
    rows = [row for part in batches for row in part.rows]
    texts = [c.text for c in completions]
    scores = shared_failure(ctx, lambda: sampler.score(questions, rows, texts, group_size))
    advantages, _ = group_advantages(scores.sum(dim=1), group_size)
    grouped_prompts = [p for part in batches for p in part.prompts for _ in range(group_size)]
    x, y = collate_completions(grouped_prompts, completions, pad_id, device)
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
    lengths = torch.tensor([c.length for c in completions], dtype=torch.float32)
    ended = torch.tensor([float(c.ended) for c in completions])
    gathered = [all_gather_rows(values.to(device), ctx).cpu() for values in (scores, lengths, ended)]
    metrics = rollout_metrics(*gathered, list(sampler.rewards), group_size)
    if sampler.tools is not None:
        metrics.update(tool_metrics(all_gather_rows(call_counts(completions).to(device), ctx).cpu().sum(dim=0)))
    return Rollout(x, y, advantages.to(device), old, ref, metrics)


def call_counts(completions: Sequence[Completion]) -> torch.Tensor:
    """A row per completion (float64): 1 (to count them), whether it began a call, and its calls
    begun, run and failed. Summed over completions, what ``tool_metrics`` reads."""
    return torch.tensor([[1.0, float(c.calls_begun > 0), c.calls_begun, c.calls_run, c.calls_failed]
                         for c in completions], dtype=torch.float64).view(-1, 5)


def tool_metrics(sums: torch.Tensor) -> dict[str, float]:
    """From ``call_counts`` summed over completions: TRL's calls per completion and share of calls
    that failed, and the share of completions that began a call and of begun calls that parsed
    (and so ran)."""
    count, calling, begun, run, failed = sums.tolist()
    return {"tools/call_frequency": run / max(count, 1.0), "tools/failure_frequency": failed / max(run, 1.0),
            "tools/calling_ratio": calling / max(count, 1.0), "tools/parsed_ratio": run / max(begun, 1.0)}


def rollout_metrics(scores: torch.Tensor, lengths: torch.Tensor, ended: torch.Tensor, names: list[str],
                    group_size: int) -> dict[str, float]:
    """TRL's rollout metrics from every completion's ``scores`` (one column per reward function),
    length (the tokens the model generated) and whether it ended, laid out group after group."""
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
    """``pass@1`` (the share of the k samples that pass) and ``pass@k`` (the share of prompts with a
    passing sample) over ``prompts``, the mean completion length, and tool metrics. Sample j of
    prompt i is seeded ``seed + i·k + j`` whatever the batching and the number of processes."""
    sums = torch.zeros(4, dtype=torch.float64)  # prompts, passing samples, prompts passed, tokens
    calls = torch.zeros(5, dtype=torch.float64)  # call_counts, summed
    for b, start in enumerate(range(0, len(prompts), batch_size)):
        if b % ctx.world_size != ctx.rank:
            continue
        chunk = range(start, min(start + batch_size, len(prompts)))
        completions = sampler.complete(policy, [prompts[i] for i in chunk], k, seed + start * k)
        calls += call_counts(completions).sum(dim=0)
        for n, i in enumerate(chunk):
            group = completions[n * k:(n + 1) * k]
            passes = sum(passed(questions[i], c.text, rows[i]) >= 1.0 for c in group)
            sums += torch.tensor([1.0, passes, float(passes > 0), sum(c.length for c in group)], dtype=torch.float64)
    device = next(policy.parameters()).device
    count, passes, solved, tokens = all_reduce_sum(sums.to(device), ctx).tolist()
    count = max(count, 1.0)
    metrics = {"pass@1": passes / (count * k), f"pass@{k}": solved / count,
               "completions/mean_length": tokens / (count * k)}
    if sampler.tools is not None:
        metrics.update(tool_metrics(all_reduce_sum(calls.to(device), ctx).cpu()))
    return metrics
