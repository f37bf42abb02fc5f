"""The largest model that fits one GPU's memory in each mode, from training/memory_budget.py's
estimate (no GPU needed, nothing is allocated).

    python -m benchmarks.memory_plan                      # the table in docs/training.md
    python -m benchmarks.memory_plan --micro-batch 8 --gib 24 80 --processes 8

The models are small.yaml's family grown in width: n_embd a multiple of 256, one layer and one
head per 64 of width, a quarter as many key/value heads, small.yaml's vocabulary and context.
Each process computes ``--micro-batch`` sequences at a time in bf16 with AdamW (Muon keeps less).
The table is an estimate: the estimator was checked against measured peaks on the CPU only.
"""

from __future__ import annotations

import argparse

from benchmarks.shared import benchmark_parser
from common.cli import positive_float, positive_int, run_command
from model import GPTConfig
from training.config import TrainConfig
from training.memory_budget import estimate_memory

MODES = (("ddp", False), ("ddp", True), ("fsdp", False), ("fsdp", True))
WIDTHS = range(256, 16384 + 1, 256)  # the family searched: a wider model than its last may fit too


def family(width: int, vocab_size: int, block_size: int) -> GPTConfig:
    heads = width // 64
    return GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=heads, n_head=heads,
                     n_kv_head=heads // 4, n_embd=width)


def largest_fitting(gib: float, parallel: str, checkpointing: bool, processes: int, micro_batch: int,
                    vocab_size: int, block_size: int) -> GPTConfig | None:
    """The widest model of the family whose estimate fits ``gib`` (None when even 256 does not;
    the last of ``WIDTHS`` when it fits, and then wider ones might too)."""
    train = TrainConfig(max_steps=1, batch_size=micro_batch, optimizer="adamw", parallel=parallel,
                        activation_checkpointing=checkpointing)
    best = None
    for width in WIDTHS:
        config = family(width, vocab_size, block_size)
        world = processes if parallel == "fsdp" else 1
        if estimate_memory(config, train, world_size=world, micro_batch=micro_batch, bf16=True).total > gib * 2**30:
            break
        best = config
    return best


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("memory_plan", __doc__)
    parser.add_argument("--gib", type=positive_float, nargs="+", default=[24, 80],
                        help="GPU memory sizes, GiB (default: %(default)s)")
    parser.add_argument("--processes", type=positive_int, default=8,
                        help="GPUs that fsdp shards over (default: %(default)s)")
    parser.add_argument("--micro-batch", type=positive_int, default=16,
                        help="sequences per process and micro-step (default: %(default)s)")
    parser.add_argument("--vocab-size", type=positive_int, default=6400,
                        help="the family's vocabulary (default: %(default)s)")
    parser.add_argument("--block-size", type=positive_int, default=512,
                        help="the family's context (default: %(default)s)")
    return run_command(parser, argv, print_table)


def print_table(args: argparse.Namespace) -> int:
    print(f"micro-batch {args.micro_batch} x {args.block_size} tokens per process, bf16, AdamW; "
          f"fsdp over {args.processes} GPUs")
    print("| GPU memory | " + " | ".join(f"{p}{' + checkpointing' if c else ''}" for p, c in MODES) + " |")
    print("|---" * (len(MODES) + 1) + "|")
    for gib in args.gib:
        cells = []
        for parallel, checkpointing in MODES:
            config = largest_fitting(gib, parallel, checkpointing, args.processes, args.micro_batch,
                                     args.vocab_size, args.block_size)
            cells.append(_cell(config))
        print(f"| {gib:g} GiB | " + " | ".join(cells) + " |")
    return 0


def _cell(config: GPTConfig | None) -> str:
    if config is None:
        return "none"
    size = f"{config.num_params() / 1e6:,.0f}M ({config.n_layer} x {config.n_embd})"
    # The search's ceiling is no answer: say that the memory holds more than it looked for.
    return f"at least {size}, the widest searched" if config.n_embd == WIDTHS[-1] else size


if __name__ == "__main__":
    raise SystemExit(main())
