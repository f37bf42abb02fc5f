"""What every torchrun worker of these tests does around its measurement: join the process
group, measure, have rank 0 write the results as JSON, and leave the group even on a failure.

A measurement keeps every rank busy until it leaves: a single-process reference is computed on
every rank rather than on rank 0 while the others wait in a collective, the state in which a loaded
host saw gloo abort rank 0."""

from __future__ import annotations

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
