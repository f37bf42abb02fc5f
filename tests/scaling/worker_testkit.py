"""Every torchrun worker's frame: join the group, measure, rank 0 writes JSON, leave even on a failure.
Every rank computes the single-process reference itself: ranks left waiting in a collective while
rank 0 computed it saw gloo abort rank 0 on a loaded host."""

import json
from collections.abc import Callable
from typing import Any

from common.files import atomic_write_text
from training.distributed import DistContext, init_distributed, shutdown


def run_worker(out_path: str, measure: Callable[[DistContext], dict[str, Any]]) -> None:
    ctx = init_distributed("cpu")
    try:
        results = {"world_size": ctx.world_size, "backend": ctx.backend, **measure(ctx)}
        if ctx.is_main:
            atomic_write_text(out_path, json.dumps(results))
    finally:
        shutdown(ctx)
