"""Under torchrun (``two_rank_steps_worker.py``): a data-parallel chat step's assistant-only loss equals
one process's over the whole global batch, a mean over every loss-bearing target. The ranks hold
very different target counts (rank 1's first micro-batch has none), so per-rank means would differ."""

import torch
import torch.nn.functional as F

from model.config import GPTConfig
from model.gpt import GPT, unwrap
from training.distributed import DistContext, sync_gradients, wrap_model
from training.tasks.chat import ChatTask

CONFIG = GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)


def global_batch() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per rank, two micro-batches of (x, y); y is -1 where no loss is taken."""
    g = torch.Generator().manual_seed(7)
    ranks = []
    for rank in range(2):
        micro = []
        for i in range(2):
            x = torch.randint(0, 64, (2, 12), generator=g)
            y = torch.randint(0, 64, (2, 12), generator=g)
            if rank == 1 and i == 0:
                y[:] = -1
            elif rank == 0:
                y[:, : 3 + 4 * i] = -1
            micro.append((x, y))
        ranks.append(micro)
    return ranks


class PreparedStub:
    """What ChatTask reads of prepared chat data before a step: its conversations (for its words), a
    tokenizer and each token's bytes."""

    train: list = []

    def tokenizer(self) -> None:
        return None

    def token_bytes(self) -> list[int]:
        return [1] * CONFIG.vocab_size


class Rows:
    """The rank's micro-batches, drawn in order as from a batch sampler."""

    def __init__(self, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.rows = iter(rows)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return next(self.rows)


def measure(ctx: DistContext) -> dict:
    batches = global_batch()
    torch.manual_seed(0)
    model = wrap_model(GPT(CONFIG), ctx)
    task = ChatTask(PreparedStub(), torch.device("cpu"))
    loss, tokens = task.accumulate(model, Rows(batches[ctx.rank]), len(batches[ctx.rank]), amp=None,
                                   sync=lambda last: sync_gradients(model, last), ctx=ctx, stop=None)
    grads = torch.cat([p.grad.reshape(-1) for p in unwrap(model).parameters()])
    torch.manual_seed(0)
    reference = GPT(CONFIG)
    xs = torch.cat([x for rank in batches for x, _ in rank])
    ys = torch.cat([y for rank in batches for _, y in rank])
    expected = F.cross_entropy(reference(xs).flatten(0, 1), ys.flatten(), ignore_index=-1)
    expected.backward()
    ref_grads = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    if not ctx.is_main:
        return {}
    return {
        "loss": loss.item(),
        "tokens": tokens,
        "expected_tokens": sum(x.numel() for rank in batches for x, _ in rank),
        "expected_loss": expected.item(),
        "max_grad_diff": (grads - ref_grads).abs().max().item(),
        "max_grad": ref_grads.abs().max().item(),
    }
