"""The child side of the crash-consistency test: one training attempt in a process forked from a server
that preloaded this module (torch and the trainer). ``kill_at_write`` makes it SIGKILL itself inside its
n-th atomic write, after the temporary file is written and before its rename (a checkpoint's most exposed
moment)."""

import os
import signal
from typing import Any

import safetensors.torch  # noqa: F401 - the imports below are preloaded once by the forkserver
import torch
import torch._dynamo  # noqa: F401 - torch.optim imports it lazily, which costs seconds per child
import tqdm.auto  # noqa: F401 - preloaded as well

import common.files
import tracking.wandb_logger  # noqa: F401
from rundir.checkpoint import CheckpointError
from training.config import config_from_dict
from training.trainer import train


def attempt(raw: dict[str, Any], resume: bool, overwrite: bool, kill_at_write: int | None) -> None:
    torch.set_num_threads(1)
    if kill_at_write is not None:
        real_fsync = common.files._fsync_file
        calls = {"n": 0}

        def fsync_then_maybe_die(path):
            real_fsync(path)
            calls["n"] += 1
            if calls["n"] == kill_at_write:
                os.kill(os.getpid(), signal.SIGKILL)

        common.files._fsync_file = fsync_then_maybe_die
    try:
        train(config_from_dict(raw), resume=resume, overwrite=overwrite, progress=False)
    except CheckpointError as error:
        # Killed after its final validation was saved: the run had finished, and a resume is
        # refused as having nothing left to do. For the test that is a run the kill came too late for.
        if " is finished: " not in str(error):
            raise
