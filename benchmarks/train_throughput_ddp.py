"""Data-parallel training throughput: N processes under torchrun against one process alone.

    torchrun --standalone --nproc_per_node=2 -m benchmarks.train_throughput_ddp --config configs/small.yaml
    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 -m benchmarks.train_throughput_ddp \
        --config configs/tiny.yaml --set train.device=cpu --steps 5

1. Every rank runs ``--steps`` optimizer steps with the model wrapped by ``training.wrap_model``
   (DDP, NCCL between GPUs, gloo on CPU), each on its own micro-batch of ``train.batch_size``
   sequences; the gradient all-reduce runs at every step, so its cost is all in the timing.
2. The other ranks then leave, and rank 0 alone runs the same steps of the config's model without
   DDP: the single-process baseline, with the machine to itself.
3. Prints a table and the scaling efficiency: global tokens/s divided by N x the baseline.

Both use ``measure_run`` from train_throughput.py (the trainer's own step functions), so the two
benchmarks time the same step, in the precision the trainer would choose (``train.precision``). With gradient accumulation the trainer all-reduces once per
optimizer step instead of once per micro-batch, so its efficiency is at least what is shown here.
Timings only; nothing here is a test.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.train_throughput import TrainStepRunner, measure_peak, measure_run, throughput_parser
from common.cli import run_command
from training.distributed import init_distributed, shutdown, wrap_model
from training.device import precision_name


def main(argv: list[str] | None = None) -> int:
    parser = throughput_parser("train_throughput_ddp", __doc__.split("\n\n")[0], "timed steps per measurement")
    parser.add_argument("--compile", choices=("auto", "true", "false"), default="auto",
                        help="compile the model; auto: on CUDA only (default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    from model import GPT
    from training.config import load_run_config
    from training.device import configure_backends, resolve_precision
    from training.metrics import format_flops
    from training.rms_norm_cpu import install_cpu_backward

    cfg = load_run_config(args.config, args.overrides)
    ctx = init_distributed(cfg.train.device)
    try:
        device = ctx.device
        configure_backends(device)
        amp_dtype = resolve_precision(cfg.train.precision, device)
        compiled = device.type == "cuda" if args.compile == "auto" else args.compile == "true"
        m, tc = cfg.model, cfg.train
        common = dict(
            batch_size=tc.batch_size, block_size=m.block_size, vocab_size=m.vocab_size, device=device,
            amp_dtype=amp_dtype, compile_model=compiled, train=tc,
        )
        timing = dict(steps=args.steps, warmup=max(1, args.warmup))

        def fresh_model() -> GPT:
            torch.manual_seed(0)
            model = GPT(m)
            install_cpu_backward(model)  # as the trainer does
            return model

        model = fresh_model()
        flops = model.flops_per_token()
        runner = TrainStepRunner(f"{ctx.world_size} processes (DDP)", wrap_model(model.to(device), ctx), flops=flops, **common)
        ddp = measure_run(runner, **timing)
        # The ranks step in lockstep (every step ends in an all-reduce), so the slowest rank sets
        # the pace of all of them.
        step_s = _max_over_ranks(ddp.step_s, ctx)
        del runner, model
        # Every rank leaves the group here, together: none is left waiting in a collective while
        # rank 0 works alone below (on a loaded host gloo has aborted a rank in that state).
        shutdown(ctx)
        if not ctx.is_main:
            return 0

        # Alone, so that neither the baseline nor the peak shares the machine with the other
        # ranks (they matter on the CPU, where processes compete for the same cores).
        peak = measure_peak(device, amp_dtype)
        model = fresh_model()
        single = measure_run(TrainStepRunner("1 process", model.to(device), flops=flops, **common), **timing)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads/process)"
        print(f"device: {name}; backend {ctx.backend or 'none'}; measured {precision_name(amp_dtype)} matmul peak "
              f"{format_flops(peak)}FLOP/s per device")
        print(f"config: {args.config}: {m.n_layer} layers, {m.n_embd} wide, block {m.block_size}, "
              f"micro-batch {tc.batch_size} per process; compile {str(compiled).lower()}; {args.steps} timed steps\n")
        rows = [
            ("1 process", 1, single.step_s, tc.batch_size * m.block_size / single.step_s),
            (f"{ctx.world_size} processes (DDP)", ctx.world_size, step_s,
             ctx.world_size * tc.batch_size * m.block_size / step_s),
        ]
        header = f"{'run':22} {'procs':>5} {'ms/step':>9} {'tok/s (all)':>12} {'MFU':>7}"
        print(header)
        print("-" * len(header))
        for label, procs, s, tps in rows:
            print(f"{label:22} {procs:5d} {1e3 * s:9.1f} {tps:12.0f} {100 * flops * tps / (procs * peak):6.1f}%")
        efficiency = rows[1][3] / (ctx.world_size * rows[0][3])
        print(f"\nscaling efficiency: {100 * efficiency:.0f}% of {ctx.world_size} x the single-process "
              f"tokens/s ({rows[1][3] / rows[0][3]:.2f}x faster)")
        if not ctx.enabled:
            print("(one process only: launch with torchrun --nproc_per_node=N to measure DDP)")
        return 0
    finally:
        shutdown(ctx)


def _max_over_ranks(value: float, ctx) -> float:
    if not ctx.enabled:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


if __name__ == "__main__":
    sys.exit(main())
