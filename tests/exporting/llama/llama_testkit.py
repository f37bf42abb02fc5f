"""Builders and references for the Llama and GGUF export tests.

A plain module (not conftest) so tests can import it by a name no other test directory uses.
"""

from __future__ import annotations

from pathlib import Path

import torch

import run_testkit
from data.tokenizer import EOT

VOCAB = 300  # run_testkit's tokenizer
BLOCK_SIZE = 48  # room for a prompt and a few dozen greedy tokens


def build_llama_run(directory: Path, *, tie: bool = True) -> Path:
    """A random Llama-shaped run: rotary positions, GQA with 2 query heads per key/value head, no
    options; <|endoftext|> never wins, so greedy decoding never ends early."""
    return run_testkit.build_run(directory, run_testkit.chat_tokenizer(), tie=tie, positions="rope",
                                 rope_theta=500.0, block_size=BLOCK_SIZE, never_predicts=(EOT,))


def our_greedy_tokens(run_dir: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """What ``generate.py --temperature 0`` produces (a plain completion: it stops at nothing)."""
    from inference.completion import generate_completions
    from inference.settings import GenerationSettings
    from rundir.loading import load_run

    run = load_run(run_dir, torch.device("cpu"))
    settings = GenerationSettings(max_new_tokens=new_tokens, temperature=0.0, seed=0)
    return generate_completions(run, prompt, settings).completions[0].token_ids


def random_ids(seed: int, length: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(5, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
