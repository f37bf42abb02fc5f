"""``train.py`` under torchrun, rank 0 SIGKILLing its process group inside the n-th sharded save (the
first argument), shards written but not published. The other arguments are train.py's."""

import os
import signal
import sys

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import train


def main(kill_at_save: int, argv: list[str]) -> int:
    real_save = dcp.save
    calls = {"n": 0}

    def save_then_maybe_die(*args, **kwargs):
        result = real_save(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == kill_at_save:
            dist.barrier()  # every rank's shards are on disk
            if dist.get_rank() == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.barrier()  # the others wait here until torchrun stops them
        return result

    dcp.save = save_then_maybe_die
    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2:]))
