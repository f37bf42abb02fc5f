"""Direct preference optimisation (DPO): the sigmoid loss, its rewards, and held-out preference accuracy.

The policy π and a frozen reference π_ref (the ``train.init_from`` run, ``training.tasks.reference``)
each give the summed log-probability of the chosen reply c and the rejected reply r:

    reward(y) = β · (log π(y | prompt) − log π_ref(y | prompt))
    loss      = −log σ(reward(c) − reward(r)) + α · NLL(c)

averaged over the step's pairs. β sets how far the policy may move. The sigmoid term alone is as
well met by making both replies less likely, and on a small set the policy drifts until replies
collapse; RPO's α · NLL(c) (``dpo.rpo_alpha``; TRL's ``loss_type=["sigmoid", "sft"]``) anchors it to
text it already wrote well, and makes the held-out loss rise again when it drifts. The metrics carry
TRL's names (``rewards/chosen``, ``rewards/accuracies``, ``rewards/margins``, ``logps/chosen``, ...)."""

import contextlib
from typing import Callable, ContextManager

import torch
import torch.nn.functional as F
from torch import nn

from data.metrics import bits_per_byte, target_nats_and_bytes
from data.batches.chat import iter_chat_val_batches
from model.gpt import eval_mode
from training.distributed import DistContext, all_reduce_sum
from training.evaluate import EvalResult, validation_bar
from training.tasks.dpo.batches import collate_pairs
from training.tasks.dpo.prepared import PreferenceSplit
from training.tasks.reference import Reference

Amp = Callable[[], ContextManager]
# The sums kept over pairs, in this order; each metric is its sum over the pair count.
_SUMS = ("pairs", "loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
         "logps/chosen", "logps/rejected")


def reply_logps(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's summed log-probability of its targets that are not -1 (in fp32)."""
    nats = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=-1, reduction="none")
    return -nats.view(y.shape).sum(dim=1)


def dpo_loss(
    policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor, beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(per-pair loss, chosen rewards, rejected rewards) from the replies' summed log-probabilities."""
    chosen_rewards = beta * (policy_chosen - ref_chosen)
    rejected_rewards = beta * (policy_rejected - ref_rejected)
    return -F.logsigmoid(chosen_rewards - rejected_rewards), chosen_rewards, rejected_rewards


def score_pairs(
    model: nn.Module, reference: Reference, x: torch.Tensor, y: torch.Tensor, beta: float, amp: Amp | None,
    rpo_alpha: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the batch's per-pair losses, with gradients; the pairs' sums, in ``_SUMS`` order; the policy's
    logits) for a batch of ``training.tasks.dpo.batches``: chosen rows first, then the rejected. With
    ``rpo_alpha`` each pair's loss adds α times the chosen replies' mean token NLL over the batch."""
    with amp() if amp is not None else contextlib.nullcontext():
        logits = model(x)
    policy = reply_logps(logits, y)
    with amp() if amp is not None else contextlib.nullcontext():
        ref = reply_logps(reference.logits(model, x), y)
    n = len(x) // 2
    losses, chosen, rejected = dpo_loss(policy[:n], policy[n:], ref[:n], ref[n:], beta)
    if rpo_alpha:
        losses = losses + rpo_alpha * -policy[:n].sum() / (y[:n] != -1).sum()
    chosen, rejected, policy = chosen.detach(), rejected.detach(), policy.detach()
    sums = torch.stack([
        torch.tensor(float(n), device=x.device), losses.detach().sum(), chosen.sum(), rejected.sum(),
        (chosen > rejected).float().sum(), (chosen - rejected).sum(), policy[:n].sum(), policy[n:].sum(),
    ]).double()
    return losses, sums, logits


def metrics_of(sums: torch.Tensor) -> dict[str, float]:
    """The mean of each ``_SUMS`` metric over the pairs counted in ``sums``."""
    values = sums.tolist()
    pairs = max(values[0], 1.0)
    return {name: value / pairs for name, value in zip(_SUMS[1:], values[1:])}


def accumulate_dpo_gradients(
    model: nn.Module,
    reference: Reference,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    beta: float,
    rpo_alpha: float = 0.0,
    amp: Amp | None = None,
    sync: Callable[[bool], ContextManager] | None = None,
    ctx: DistContext = DistContext(),
) -> tuple[torch.Tensor, dict[str, float]]:
    """Backward the mean DPO loss over the step's pairs (every micro-batch holds as many, so it is the
    mean of the micro-batch means); return it (detached, this process's) and the step's metrics."""
    sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=micro_batches[0][0].device)
    for i, (x, y) in enumerate(micro_batches):
        with sync(i == len(micro_batches) - 1) if sync is not None else contextlib.nullcontext():
            losses, batch_sums, _ = score_pairs(model, reference, x, y, beta, amp, rpo_alpha)
            (losses.mean() / len(micro_batches)).backward()
        sums += batch_sums
    loss = (sums[1] / sums[0]).float()
    return loss, metrics_of(all_reduce_sum(sums, ctx))


@torch.no_grad()
def evaluate_preferences(
    model: nn.Module,
    reference: Reference,
    split: PreferenceSplit,
    token_bytes: torch.Tensor,
    *,
    beta: float,
    rpo_alpha: float = 0.0,
    batch_size: int,
    max_batches: int | None,
    pad_id: int,
    device: torch.device,
    amp: Amp | None = None,
    ctx: DistContext = DistContext(),
    progress: bool = False,
) -> EvalResult:
    """The DPO loss over held-out pairs (``batch_size`` of them a batch), the preference metrics, and
    the bits per byte of the chosen replies under the policy, <|end|> charged as a chat run's is."""
    batches = iter_chat_val_batches(split, batch_size, pad_id=pad_id, max_batches=max_batches, device=device,
                                    collate_rows=collate_pairs)
    if progress:
        batches = validation_bar(batches, len(split), batch_size, max_batches)
    sums = torch.zeros(len(_SUMS), dtype=torch.float64, device=device)
    text = torch.zeros(3, dtype=torch.float64, device=device)  # nats, bytes and tokens of the chosen replies
    with eval_mode(model):
        for i, (x, y) in enumerate(batches):
            if i % ctx.world_size != ctx.rank:
                continue
            _, batch_sums, logits = score_pairs(model, reference, x, y, beta, amp, rpo_alpha)
            sums += batch_sums
            n = len(x) // 2
            nats, nbytes = target_nats_and_bytes(logits[:n], y[:n], token_bytes, charge_zero_byte=True)
            text += torch.stack([nats.double(), nbytes.double(), (y[:n] != -1).sum().double()])
    metrics = metrics_of(all_reduce_sum(sums, ctx))
    nats, nbytes, tokens = all_reduce_sum(text, ctx).tolist()
    return EvalResult(
        loss=metrics.pop("loss"),
        bpb=bits_per_byte(nats, int(nbytes)) if nbytes > 0 else float("nan"),
        tokens=int(tokens),
        bytes=int(nbytes),
        metrics=metrics,
    )
