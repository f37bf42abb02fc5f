"""Decode speed on the CPU, batch 1, greedy, at a context of 128: ONNX Runtime running the exported
graphs (``export.py --format onnx``, dynamic and ``--static-shapes``) against generate.py's own path
(PyTorch with the KV cache).

    python -m benchmarks.onnx_decode [--run DIR] [--context 128] [--new-tokens 64] [--threads N]

Without ``--run`` the model is generate_speed.py's random GPT of the tiny size (block_size 512);
speed does not depend on the weights. The prompt is ``--context`` tokens; decode tokens/s counts
the tokens after the first over the time after the first, as generate_speed.py does, and each
figure is the best of round-robin repeats (on a shared machine other load only slows a run down).
The dynamic graph reads the prompt in one call; the static graph one token a call, and attends
over all block_size slots at every step (its price for fixed shapes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.generate_speed import (decode_parser, load_benchmark_run, onnx_session, onnx_timer, ours_timer,
                                       print_table, round_robin)
from common.cli import positive_int, run_command
from common.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = decode_parser("onnx_decode", __doc__, 64)
    parser.add_argument("--context", type=positive_int, default=128,
                        help="prompt tokens before decoding (default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    import onnxruntime as ort  # here, a requirement: this benchmark is about it

    run = load_benchmark_run(args)
    config = run.model.config
    if args.context + args.new_tokens > config.block_size:
        raise UserError(f"--context + --new-tokens must fit block_size {config.block_size}")
    prompt = torch.randint(config.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    print(f"model: n_layer {config.n_layer}, n_embd {config.n_embd}, n_head {config.n_head}, n_kv_head "
          f"{config.n_kv_head}, vocab {config.vocab_size}, block_size {config.block_size}; CPU, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, onnxruntime {ort.__version__}")

    with tempfile.TemporaryDirectory() as folder:
        paths = {"generate.py (PyTorch)": ours_timer(run, prompt, args.new_tokens, use_cache=True)}
        for name, static in (("ONNX Runtime, dynamic", False), ("ONNX Runtime, static", True)):
            _, session = onnx_session(run.model, Path(folder) / f"{static}.onnx", torch.get_num_threads(), static)
            paths[name] = onnx_timer(session, run.model, prompt, args.new_tokens, static)
        rows = round_robin(paths, f"{args.context} + {args.new_tokens}", args.repeats)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
