"""What the GRPO tests share: a reward an untrained model's replies already differ on (so its
advantages are not all zero), and GRPO's loss written out by hand, which the product's is tested against."""

import torch


def e_share(prompt: str, completion: str, row: dict) -> float:
    """The share of the reply's characters that are the letter e."""
    return completion.count("e") / max(len(completion), 1)


def written_out_grpo_loss(model, rollout, targets: torch.Tensor, mask: torch.Tensor, *, epsilon: float,
                          beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's loss (the clipped surrogate, on-policy, plus β times the k3 estimate of the KL to
    the reference) and their token mean Σ(loss·mask)/Σmask, the number the trainer's loss must equal."""
    logps = torch.log_softmax(model(rollout.x).float(), -1).gather(-1, targets[..., None])[..., 0]
    ratio = torch.exp(logps - logps.detach())  # on-policy: 1, with the log-probability's gradient
    a = rollout.advantages[:, None]
    surrogate = torch.min(ratio * a, ratio.clamp(1 - epsilon, 1 + epsilon) * a)
    delta = rollout.ref_logps - logps
    per_token = -surrogate + beta * (torch.exp(delta) - delta - 1)
    return per_token, (per_token * mask).sum() / mask.sum()
