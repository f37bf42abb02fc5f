"""Decode speed with the KV cache vs full recomputation, and KV cache memory for MHA vs GQA.

    python -m benchmarks.decode_speed                       # tiny (configs/tiny.yaml) + MiniMind-small
    python -m benchmarks.decode_speed --block-size 512 --vocab-size 4096
    python -m benchmarks.decode_speed --contexts 128 256 --only tiny

For each model, one greedy generation per path runs from a short prompt up to the largest context.
Tokens/s "to context L" is the number of new tokens up to L divided by the time to produce them
(prompt encoding included); the latency table is the median time of one decoding step within
each band of context lengths. Both paths run the same code (inference.engine.decode)
and differ only in use_cache. Weights are random (GPT-2 init): speed does not depend on them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from common.cli import ArgumentParser, path_arg, positive_int, run_command
from common.errors import UserError
from common.threads import thread_count
from inference.engine import decode
from inference.sampling import SamplingSettings
from model import GPT, GPTConfig, KVCache

DEFAULT_CONFIG = Path("configs/tiny.yaml")
BUILTIN_TINY = GPTConfig(vocab_size=4096, block_size=512, n_layer=4, n_head=4, n_kv_head=2, n_embd=256)
MINIMIND_SMALL = GPTConfig(vocab_size=6400, block_size=512, n_layer=8, n_head=8, n_kv_head=2, n_embd=512)


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="python -m benchmarks.decode_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=path_arg, default=None,
                   help=f"YAML whose model section defines 'tiny' (default: {DEFAULT_CONFIG} if it exists)")
    p.add_argument("--vocab-size", type=positive_int, default=None,
                   help="override the tiny model's vocab_size (default: the config's)")
    p.add_argument("--block-size", type=positive_int, default=None,
                   help="override the tiny model's block_size (default: the config's)")
    p.add_argument("--contexts", type=positive_int, nargs="+", default=[128, 256, 512],
                   help="context lengths to report; block_size is always added (default: %(default)s)")
    p.add_argument("--prompt-len", type=positive_int, default=16, help="prompt tokens (default: %(default)s)")
    p.add_argument("--only", choices=["tiny", "minimind-small"], default=None,
                   help="time one of the two models (default: both)")
    p.add_argument("--device", default="auto",
                   help="auto (cuda if available), cpu or cuda (default: %(default)s)")
    p.add_argument("--threads", type=thread_count, default=None, help="torch CPU threads (default: torch's choice)")
    return p


def tiny_config(args: argparse.Namespace) -> tuple[GPTConfig, str]:
    path = args.config if args.config is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    if path is None:
        config, source = BUILTIN_TINY, "built-in"
    else:
        config, source = model_config_from_yaml(path), str(path)
    overrides = {k: v for k, v in (("vocab_size", args.vocab_size), ("block_size", args.block_size)) if v}
    return replace(config, **overrides), source + (" + flags" if overrides else "")


def model_config_from_yaml(path: Path) -> GPTConfig:
    import yaml

    if not path.is_file():
        raise ValueError(f"config file {path} does not exist; pass an existing YAML or omit --config")
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    model = dict(doc.get("model") or {})
    # As in training configs, model.vocab_size may be left to data.vocab_size.
    model.setdefault("vocab_size", (doc.get("data") or {}).get("vocab_size", BUILTIN_TINY.vocab_size))
    return GPTConfig.from_dict(model)


def time_generation(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool,
                    device: torch.device) -> list[float]:
    """Seconds from the start until each new token was produced (prompt encoding included)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    greedy = SamplingSettings(max_new_tokens=4, temperature=0.0)
    decode(model, prompt.tolist(), greedy, use_cache=use_cache)  # warm up kernels and allocator
    sync()
    stamps = []

    def stamp(row: int, event) -> None:
        if row == 0 and event.token_id is not None:
            sync()
            stamps.append(time.perf_counter() - start)

    start = time.perf_counter()
    decode(model, prompt.tolist(), replace(greedy, max_new_tokens=new_tokens), use_cache=use_cache, on_event=stamp)
    return stamps


def step_latencies(stamps: list[float]) -> list[float]:
    # Step i (i >= 1) is one forward over a context of prompt_len + i tokens plus sampling.
    return [b - a for a, b in zip(stamps, stamps[1:])]


def kv_bytes(config: GPTConfig, n_kv_head: int, dtype: torch.dtype) -> int:
    entries = {"k": (n_kv_head, config.head_dim), "v": (n_kv_head, config.head_dim)}
    cache = KVCache(config.n_layer, 1, config.block_size, entries, device="meta", dtype=dtype)
    return cache.nbytes()


def report(name: str, source: str, config: GPTConfig, args: argparse.Namespace, device: torch.device) -> None:
    torch.manual_seed(0)
    model = GPT(config).to(device).eval()
    block = config.block_size
    contexts = sorted({c for c in args.contexts if args.prompt_len < c <= block} | {block})
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt_len), device=device)
    new_tokens = contexts[-1] - args.prompt_len

    print(f"\n== {name} ({source}): n_layer={config.n_layer} n_embd={config.n_embd} n_head={config.n_head} "
          f"n_kv_head={config.n_kv_head} vocab={config.vocab_size} block={config.block_size} "
          f"params={model.num_params() / 1e6:.2f}M")
    stamps = {}
    for use_cache in (True, False):
        stamps[use_cache] = time_generation(model, prompt, new_tokens, use_cache, device)

    print(f"{'to context':>10} {'new tok':>8} {'cached tok/s':>13} {'full tok/s':>11} {'speedup':>8}")
    for ctx in contexts:
        n = ctx - args.prompt_len
        cached, full = n / stamps[True][n - 1], n / stamps[False][n - 1]
        print(f"{ctx:>10} {n:>8} {cached:>13.1f} {full:>11.1f} {cached / full:>7.1f}x")

    print(f"{'context band':>14} {'cached ms/tok':>14} {'full ms/tok':>12}")
    lat = {k: step_latencies(v) for k, v in stamps.items()}
    band = 64 if config.block_size >= 256 else max(8, config.block_size // 4)
    medians = []
    for lo in range(0, contexts[-1], band):
        # latency index i belongs to context prompt_len + i + 1
        idx = [i for i in range(len(lat[True])) if lo < args.prompt_len + i + 1 <= lo + band]
        if not idx:
            continue
        c = statistics.median(lat[True][i] for i in idx) * 1e3
        f = statistics.median(lat[False][i] for i in idx) * 1e3
        medians.append(c)
        print(f"{f'{lo + 1}-{lo + band}':>14} {c:>14.2f} {f:>12.2f}")
    print(f"cached per-token time, last band / first band: {medians[-1] / medians[0]:.2f}x (1.00 = flat)")

    for dtype in (torch.float32, torch.bfloat16):
        mha, gqa = kv_bytes(config, config.n_head, dtype), kv_bytes(config, config.n_kv_head, dtype)
        print(f"KV cache, batch 1 x {config.block_size} positions, {str(dtype).replace('torch.', '')}: "
              f"MHA {mha / 2**20:.2f} MiB, GQA ({config.n_kv_head} KV heads) {gqa / 2**20:.2f} MiB "
              f"= {gqa / mha:.3f} of MHA")


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, measure)


def measure(args: argparse.Namespace) -> int:
    try:
        tiny, source = tiny_config(args)
    except (ValueError, OSError) as e:
        raise UserError(str(e)) from None
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if args.device == "auto" else args.device))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
          f"{os.cpu_count()} cores, load average {load:.1f}, prompt {args.prompt_len} tokens, greedy, fp32")
    models = [("tiny", tiny, source), ("minimind-small", MINIMIND_SMALL, "built-in")]
    for name, config, src in models:
        if args.only in (None, name):
            report(name, src, config, args, device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
