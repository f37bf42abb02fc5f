"""How closely a run exported for transformers follows our model: logits and greedy tokens.

    python -m benchmarks.hf_export_parity --run runs/tiny

Exports the run to a temporary folder, loads it with AutoModelForCausalLM (trust_remote_code),
and prints two tables: the largest absolute logit difference in fp32 on random prompts of
several lengths and on a left-padded batch; and how many of the greedy tokens transformers'
``generate`` produces (with and without its cache) equal generate.py's ``--temperature 0``
tokens, for a prompt filled up to the end of the window.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.shared import benchmark_parser
from common.cli import path_arg, run_command
from exporting.hf import export_run
from inference.completion import encode_prompt, generate_completions
from inference.settings import GenerationSettings
from rundir.loading import load_run


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser("hf_export_parity", __doc__)
    p.add_argument("--run", type=path_arg, required=True, help="run directory written by train.py (required)")
    p.add_argument("--prompt", default="ROMEO:", help="prompt for the greedy comparison (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default: %(default)s)")
    return p


def logit_differences(ours, theirs, vocab_size: int, block_size: int, seed: int) -> list[tuple[str, float]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    with torch.no_grad():
        for length in sorted({1, 16, block_size // 2, block_size}):
            ids = torch.randint(0, vocab_size, (4, length), generator=g)
            rows.append((f"4 x {length} tokens", (theirs(ids).logits - ours(ids)).abs().max().item()))
        lengths = [block_size, block_size // 2, 3]
        ids = torch.zeros(len(lengths), block_size, dtype=torch.long)
        mask = torch.zeros_like(ids)
        worst = 0.0
        for i, n in enumerate(lengths):
            ids[i, block_size - n:] = torch.randint(0, vocab_size, (n,), generator=g)
            mask[i, block_size - n:] = 1
        padded = theirs(ids, attention_mask=mask).logits
        for i, n in enumerate(lengths):
            worst = max(worst, (padded[i, block_size - n:] - ours(ids[i:i + 1, block_size - n:])[0]).abs().max().item())
        rows.append((f"left-padded batch {lengths}", worst))
    return rows


def greedy_agreement(run, theirs, prompt: str) -> list[tuple[str, int, int]]:
    prompt_ids = encode_prompt(run, prompt).ids
    new = run.block_size - len(prompt_ids)
    rows = []
    for use_cache in (True, False):
        settings = GenerationSettings(max_new_tokens=new, temperature=0.0, use_cache=use_cache, seed=0)
        ours = generate_completions(run, prompt_ids, settings).completions[0].token_ids
        ids = torch.tensor([prompt_ids])
        out = theirs.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                              use_cache=use_cache, eos_token_id=None)[0, len(prompt_ids):].tolist()
        same = next((i for i, (a, b) in enumerate(zip(ours, out)) if a != b), len(ours))
        rows.append(("cache" if use_cache else "no cache", same, len(ours)))
    return rows


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, compare)


def compare(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM

    run = load_run(args.run, torch.device("cpu"))
    config = run.model.config
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_run(args.run, Path(tmp) / "export").out_dir
        theirs = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
        diffs = logit_differences(run.model, theirs, config.vocab_size, config.block_size, args.seed)
        greedy = greedy_agreement(run, theirs, args.prompt)
    print(f"run {args.run}: {run.model.num_params() / 1e6:.2f}M parameters, block_size {config.block_size}, fp32, "
          f"torch {torch.__version__}, transformers {__import__('transformers').__version__}")
    print(f"\n{'logits on':<36} {'max |ours - transformers|':>26}")
    for name, diff in diffs:
        print(f"{name:<36} {diff:>26.2e}")
    print(f"\n{'greedy generate, prompt ' + repr(args.prompt):<36} {'equal tokens (first difference)':>32}")
    for name, same, total in greedy:
        print(f"{name:<36} {f'{same} / {total}':>32}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
