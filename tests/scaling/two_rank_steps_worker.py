"""Run under ``torchrun --nproc_per_node=2``: the data-parallel step against one process's
(``ddp_equivalence_worker``), then the chat step's loss over every loss-bearing target
(``chat_ddp_worker``), in one launch: starting two processes costs more than both measurements.
Rank 0 writes both as JSON to the path given as the only argument; the tests assert on it."""

from __future__ import annotations

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
