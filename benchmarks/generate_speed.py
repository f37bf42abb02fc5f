"""Decode speed of generate.py's path on the CPU, batch 1, greedy: with the KV cache, with
--no-cache (full recomputation), and Hugging Face ``transformers`` at the same dimensions as a
point of comparison.

    python -m benchmarks.generate_speed [--run DIR] [--new-tokens 256] [--threads N]

Without ``--run`` the model is a random GPT of the tiny size (n_layer 4, n_embd 256, n_head 4,
n_kv_head 2, vocab 2048, block_size 512); speed does not depend on the weights. Two prompts: a
short one, and one long enough that the last token sits at the full context (block_size).

Decode tokens/s counts the tokens after the first, over the time after the first, so prefill is
left out of it and shown apart as time to first token. transformers' ``generate`` exposes no
per-token clock, so its decode time is t(N tokens) - t(1 token). Each figure is the best of the
repeats, which run round-robin over the paths: on a shared machine other processes only ever
slow a run down, so the best run is the closest to the code's own speed.

Goals: our cached decode >= 1.5x transformers, and >= 5x our own --no-cache at full context.
``transformers`` is a benchmark-only extra (``pip install transformers``); without it that row is
skipped with a note.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.completion import generate_completions
from inference.settings import GenerationSettings
from model import GPT, GPTConfig
from rundir.loading import LoadedRun, load_run

TINY = GPTConfig(vocab_size=2048, block_size=512, n_layer=4, n_head=4, n_kv_head=2, n_embd=256)
SHORT_PROMPT = 16


@dataclass
class Row:
    name: str
    context: str
    time_to_first_token_s: float | None
    decode_tokens_per_s: float | None
    note: str = ""


def decode_parser(description: str, new_tokens: int) -> argparse.ArgumentParser:
    """The flags every decode-speed benchmark takes: --run, --new-tokens, --repeats, --threads."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, help="benchmark this run's model instead of a random tiny one")
    parser.add_argument("--new-tokens", type=int, default=new_tokens)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many timed runs (default 3)")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: torch's choice)")
    return parser


def load_benchmark_run(args: argparse.Namespace) -> LoadedRun:
    """``--run``'s model, or a random one of the tiny size, after applying ``--threads``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return load_run(args.run, torch.device("cpu")) if args.run else random_run(TINY)


def main(argv: list[str] | None = None) -> int:
    args = decode_parser(__doc__, 256).parse_args(argv)
    run = load_benchmark_run(args)
    config = run.model.config
    new = args.new_tokens
    generator = torch.Generator().manual_seed(0)
    prompts = {
        f"{SHORT_PROMPT} + {new}": SHORT_PROMPT,
        f"{max(1, config.block_size - new)} + {new} (full)": max(1, config.block_size - new),
    }
    print(
        f"model: n_layer {config.n_layer}, n_embd {config.n_embd}, n_head {config.n_head}, "
        f"n_kv_head {config.n_kv_head}, ffn {config.ffn_dim}, vocab {config.vocab_size}, "
        f"block_size {config.block_size}; CPU, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )

    rows: list[Row] = []
    hf_name, hf_model = transformers_model(config)
    for context, length in prompts.items():
        prompt = torch.randint(config.vocab_size, (length,), generator=generator).tolist()
        paths = {
            "ours, KV cache": ours_timer(run, prompt, new, use_cache=True),
            "ours, --no-cache": ours_timer(run, prompt, new, use_cache=False),
        }
        if hf_model is not None:
            paths[hf_name] = transformers_timer(hf_model, prompt, new)
        # Round-robin repeats: on a shared machine the load drifts, and interleaving spreads the
        # drift over every path instead of penalising whichever ran during a busy spell.
        timings: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for _ in range(args.repeats):
            for name, timer in paths.items():
                timings[name].append(timer())
        for name, runs in timings.items():
            rows.append(Row(name, context, min(t for t, _ in runs), max(rate for _, rate in runs)))
        if hf_model is None:
            rows.append(Row("transformers", context, None, None, note=hf_name))

    print_table(rows)
    print_ratios(rows, list(prompts))
    return 0


def random_run(config: GPTConfig) -> LoadedRun:
    torch.manual_seed(0)
    model = GPT(config).eval()
    # No tokenizer is needed to time decoding; streaming still decodes every token's bytes.
    token_bytes = [f"<{i}>".encode() for i in range(config.vocab_size)]
    return LoadedRun(Path("(random init)"), model, None, token_bytes, 0, torch.device("cpu"))


def ours_timer(run: LoadedRun, prompt: list[int], new: int, *, use_cache: bool):
    """A warmed-up callable returning (time to first token s, decode tokens/s) of one generation."""
    settings = GenerationSettings(max_new_tokens=new, temperature=0, use_cache=use_cache)
    generate_completions(run, prompt, GenerationSettings(max_new_tokens=8, temperature=0, use_cache=use_cache))

    def timer() -> tuple[float, float]:
        stats = generate_completions(run, prompt, settings, on_text=lambda row, text: None).stats
        return stats.time_to_first_token_s, stats.decode_tokens_per_s

    return timer


def transformers_model(config: GPTConfig) -> tuple[str, object | None]:
    """(row name, LlamaForCausalLM with our dimensions), or (a note saying why, None)."""
    try:
        import transformers
    except ImportError:
        return "skipped: transformers is not installed (pip install transformers to compare)", None
    transformers.logging.set_verbosity_error()
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.n_embd,
        intermediate_size=config.ffn_dim,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head,
        max_position_embeddings=config.block_size,
        rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings,
    )
    torch.manual_seed(0)
    return f"transformers {transformers.__version__}", transformers.LlamaForCausalLM(hf_config).eval()


def transformers_timer(model, prompt: list[int], new: int):
    """Like ``ours_timer``; generate() has no per-token clock, so decode = t(new) - t(1 token)."""
    ids = torch.tensor([prompt])

    def seconds_for(n: int) -> float:
        start = time.perf_counter()
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,  # never stop early at an end-of-sequence token
            pad_token_id=0,
        )
        return time.perf_counter() - start

    seconds_for(8)  # warm-up

    def timer() -> tuple[float, float]:
        first = seconds_for(1)
        return first, (new - 1) / (seconds_for(new) - first)

    return timer


def print_table(rows: list[Row]) -> None:
    print()
    print(f"{'path':<22} {'prompt + new tokens':<22} {'first token ms':>15} {'decode tok/s':>13}")
    for row in rows:
        if row.decode_tokens_per_s is None:
            print(f"{row.name:<22} {row.context:<22} {row.note}")
            continue
        print(
            f"{row.name:<22} {row.context:<22} {row.time_to_first_token_s * 1000:>15.1f} "
            f"{row.decode_tokens_per_s:>13.1f}"
        )


def print_ratios(rows: list[Row], contexts: list[str]) -> None:
    def rate(prefix: str, context: str) -> float | None:
        return next((r.decode_tokens_per_s for r in rows if r.name.startswith(prefix) and r.context == context), None)

    print()
    for context in contexts:
        cached = rate("ours, KV cache", context)
        full = rate("ours, --no-cache", context)
        hf = rate("transformers", context)
        print(f"[{context}] cache / no-cache: {cached / full:.2f}x", end="")
        print(f"; cache / transformers: {cached / hf:.2f}x" if hf else "; transformers: n/a")
    full_context = contexts[-1]
    cached, full, hf = (rate(p, full_context) for p in ("ours, KV cache", "ours, --no-cache", "transformers"))
    print(f"goal: cache >= 5x --no-cache at full context: {'met' if cached >= 5 * full else 'NOT met'}")
    if hf:
        worst = min(rate("ours, KV cache", c) / rate("transformers", c) for c in contexts)
        print(f"goal: cache >= 1.5x transformers (worst context): {'met' if worst >= 1.5 else 'NOT met'}")


if __name__ == "__main__":
    sys.exit(main())
