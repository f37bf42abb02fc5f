"""Decode speed on a CUDA GPU, batch 1, greedy, side by side in one run: our eager step against the
compiled step (``--compile``: one CUDA graph replayed per token), and transformers' Llama at the
same dimensions, at a short and at the full context; and whether eager and compiled chose the same
tokens.

    python -m benchmarks.cuda_decode [--run runs/small] [--config configs/small.yaml] [--dtype fp32|bf16]

Without ``--run`` the model is random at the config's model shape (speed does not depend on the
weights). ``--dtype bf16`` casts the weights (and so the cache) to bfloat16. Figures are read as in
benchmarks/generate_speed.py: decode tokens/s counts the tokens after the first, each figure is the
best of round-robin repeats, and the compile is printed apart. A GPU is needed; CI never runs this.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common.cli import path_arg, run_command
from common.errors import UserError
from benchmarks.generate_speed import (
    COMPILED, EAGER, Row, context_prompts, decode_parser, ours_timer, print_table, random_run, transformers_model,
    round_robin, transformers_timer,
)
from inference.completion import generate_completions
from inference.settings import GenerationSettings
from rundir.loading import LoadedRun, load_run
from training.config import load_run_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main(argv: list[str] | None = None) -> int:
    parser = decode_parser("cuda_decode", __doc__, 256)
    parser.add_argument("--config", type=path_arg, default=Path("configs/small.yaml"),
                        help="the model shape to time without --run (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                        help="the weights' and the cache's dtype (default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise UserError("benchmarks.cuda_decode needs a CUDA GPU; on the CPU use benchmarks.generate_speed")
    device = torch.device("cuda")
    run = load_run(args.run, device) if args.run else random_run(load_run_config(args.config).model, device)
    run.model.to(DTYPES[args.dtype])
    config, new = run.model.config, args.new_tokens
    print(f"model: {run.directory}, n_layer {config.n_layer}, n_embd {config.n_embd}, n_head {config.n_head}, "
          f"n_kv_head {config.n_kv_head}, vocab {config.vocab_size}, block_size {config.block_size}, {args.dtype}; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    generator = torch.Generator().manual_seed(0)
    prompts = context_prompts(config, new)
    hf_name, hf_model = transformers_model(config)
    if hf_model is not None:
        hf_model = hf_model.to(device, DTYPES[args.dtype])
    rows: list[Row] = []
    for context, length in prompts.items():
        prompt = torch.randint(config.vocab_size, (length,), generator=generator).tolist()
        print(f"[{context}] {same_tokens(run, prompt, new)}")
        paths = {EAGER: ours_timer(run, prompt, new, use_cache=True),
                 COMPILED: ours_timer(run, prompt, new, use_cache=True, compile=True)}
        if hf_model is not None:
            paths[hf_name] = transformers_timer(hf_model, prompt, new)
        rows += round_robin(paths, context, args.repeats)
    if hf_model is None:
        rows.append(Row("transformers", "", None, None, note=f"skipped: {hf_name}"))
    print_table(rows)
    print()
    for context in prompts:
        rate = {row.name: row.decode_tokens_per_s for row in rows if row.context == context}
        peers = ", ".join(f"{rate[COMPILED] / rate[name]:.2f}x {name}" for name in rate if name != COMPILED)
        print(f"[{context}] {COMPILED}: {peers}")
    return 0


def same_tokens(run: LoadedRun, prompt: list[int], new: int) -> str:
    """Whether the compiled step's greedy tokens equal the eager step's, in words."""
    def tokens(compile: bool) -> tuple[list[int], float | None]:
        result = generate_completions(run, prompt, GenerationSettings(max_new_tokens=new, temperature=0,
                                                                      compile=compile))
        return result.completions[0].token_ids, result.stats.compile_s

    (eager, _), (compiled, compile_s) = tokens(False), tokens(True)
    if compile_s:  # the process's first compile; later ones find its graphs
        print(f"{COMPILED}: the decode step compiled in {compile_s:.1f} s")
    return token_agreement(eager, compiled)


def token_agreement(eager: list[int], compiled: list[int]) -> str:
    """Whether two paths chose the same tokens, in words: if not, where they first part."""
    if eager == compiled:
        return f"compiled and eager chose the same {len(eager)} greedy tokens"
    # One may stop early (an end token) where the other goes on: then they part where it stopped.
    first = next((i for i, (a, b) in enumerate(zip(eager, compiled)) if a != b), min(len(eager), len(compiled)))
    return f"compiled and eager greedy tokens first differ at new token {first} of {len(eager)}"


if __name__ == "__main__":
    raise SystemExit(main())
