"""Under torchrun: ``ddp_equivalence_worker`` then ``chat_ddp_worker`` in one launch (two starts cost
more than both); rank 0 writes both as JSON to the given path."""

import sys

import torch

import chat_ddp_worker
import ddp_equivalence_worker
from worker_testkit import run_worker


def measure(ctx) -> dict:
    chat = chat_ddp_worker.measure(ctx)
    torch.use_deterministic_algorithms(True)
    return {"ddp": ddp_equivalence_worker.measure(ctx), "chat": chat}


if __name__ == "__main__":
    run_worker(sys.argv[1], measure)
