"""``train_throughput --ddp`` with every gradient bucket waiting DELAY_S seconds before torch's own
all-reduce hook (DDP's documented ``register_comm_hook``), for test_benchmarks_run.py:

    torchrun --standalone --nproc_per_node=2 tests/benchmarks/ddp_slow_allreduce_worker.py DELAY_S [benchmark args]"""

import sys
import time

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

import benchmarks.train_throughput as benchmark


def main() -> int:
    delay_s, args = float(sys.argv[1]), sys.argv[2:]
    wrap_model = benchmark.wrap_model

    def wrap_with_a_slow_all_reduce(model, ctx):
        wrapped = wrap_model(model, ctx)

        def slow_all_reduce(process_group, bucket):
            time.sleep(delay_s)
            return allreduce_hook(process_group, bucket)

        wrapped.register_comm_hook(None, slow_all_reduce)
        return wrapped

    benchmark.wrap_model = wrap_with_a_slow_all_reduce
    return benchmark.main(["--ddp", *args])


if __name__ == "__main__":
    sys.exit(main())
