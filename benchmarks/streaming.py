"""Past the window without re-encoding: a rotary or no-position run over a stream of many windows.

    python -m benchmarks.streaming --run runs/tiny-rope --window-multiples 10

The stream is the run's held-out plays (the validation text of its own split), cut to
``--window-multiples`` x block_size tokens. Every token of it is predicted three ways:

- reference: from the previous block_size tokens, encoded afresh for every token (a sliding window
  recomputed: what a window of block_size can do at best, and the slowest way to do it);
- rolling: the engine's rolling cache (``inference.sampling.Window`` with attention sinks): one
  cached step per token, the middle evicted and the moved rotary keys turned, nothing re-encoded;
- re-encode: the learned runs' policy on the same run: once the window is full, its most recent
  half is encoded again from position 0.

Each is scored as bits per byte of the stream (the targets' nats over their UTF-8 bytes), with the
positions its cache held, the cache's bytes and the process's resident memory over the stream.
Speed is the engine's: it generates as many tokens from the stream's first window, rolling,
re-encoding, and uncached (the reference), and the table gives each one's tokens/s.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from benchmarks.shared import benchmark_parser, in_turns
from common.cli import path_arg, positive_int, run_command
from common.errors import UserError
from evaluation.plays import held_out_plays
from inference.engine import decode
from inference.sampling import SINKS, SamplingSettings, Window, default_sinks
from model import GPT
from rundir.loading import load_run
from training.config import load_run_config


@dataclass
class StreamScore:
    """What one way of predicting did over the stream."""

    name: str
    nats: list[float] = field(default_factory=list)  # per scored target (those of one byte or more)
    nbytes: int = 0
    held: list[int] = field(default_factory=list)  # positions in the cache, sampled once per window
    rss: list[int] = field(default_factory=list)  # resident bytes, sampled once per window
    cache_bytes: int = 0
    seconds: float = 0.0

    @property
    def bits_per_byte(self) -> float:
        return sum(self.nats) / math.log(2) / self.nbytes


def resident_bytes() -> int:
    """The process's resident memory now (Linux's /proc), or 0 where that cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@torch.inference_mode()
def score_stream(model: GPT, ids: list[int], token_bytes: list[int], window: Window, *, use_cache: bool,
                 name: str) -> StreamScore:
    """Predict every token of ``ids`` after the first from the ones before it, sliding as ``window``
    says, as the engine does: with the cache, one cached step per token (a slide re-encodes or
    rolls); without it, the whole window encoded afresh for every token. Targets of no bytes (an
    end-of-text token) are not scored, as in training's bits/byte."""
    score = StreamScore(name)
    cache = model.init_cache(1) if use_cache else None
    score.cache_bytes = cache.nbytes() if cache is not None else 0
    start = evicted = 0
    started = time.perf_counter()
    for i in range(len(ids) - 1):
        new_start, new_evicted = window.slide(start, evicted, i + 1)
        kept = window.tokens(ids[:i + 1], new_start, new_evicted)
        if cache is None:
            logits = model.next_token_logits(torch.tensor([kept]))
        elif i == 0 or new_start != start:  # the first token, or a re-encode from position 0
            cache.reset()
            logits = model.next_token_logits(torch.tensor([kept]), cache, [0])
        else:
            if new_evicted != evicted:
                cache.drop(0, window.sinks, new_evicted - evicted, model.move_entries)
            logits = model.next_token_logits(torch.tensor([[ids[i]]]), cache, [0])
        start, evicted = new_start, new_evicted
        target = ids[i + 1]
        if token_bytes[target]:
            score.nats.append(-float(torch.log_softmax(logits[0].float(), dim=-1)[target]))
            score.nbytes += token_bytes[target]
        if (i + 1) % window.block_size == 0:
            score.held.append(cache.lengths[0] if cache is not None else len(kept))
            score.rss.append(resident_bytes())
    score.seconds = time.perf_counter() - started
    return score


# How each way generates: the engine's options for it.
GENERATION = {"reference": dict(use_cache=False, roll=False, keep_fraction=1.0), "rolling": dict(),
              "re-encode": dict(roll=False)}


def generation_speeds(model: GPT, prompt: list[int], new_tokens: int, repeats: int, sinks: int) -> dict[str, float]:
    """Tokens/s of the engine generating ``new_tokens`` after ``prompt`` (sampled, seed 0) each way,
    the best of ``repeats`` taken in turns: on a shared machine the fastest run is the one least
    slowed by the others, and turns spread a busy spell over every way alike."""
    settings = SamplingSettings(max_new_tokens=new_tokens, temperature=0.8, top_p=0.95, seed=0)

    def generate(options: dict) -> None:
        finish, = decode(model, [prompt], settings, **{"sinks": sinks, **options})
        assert finish.completion_tokens == new_tokens, "the generation ended early"  # no end ids are given

    seconds = in_turns({name: partial(generate, options) for name, options in GENERATION.items()}, repeats)
    return {name: new_tokens / min(spent) for name, spent in seconds.items()}


def stream_ids(run_dir: Path, tokenizer, tokens: int) -> list[int]:
    """The first ``tokens`` tokens of the run's held-out plays, one after the other."""
    data = load_run_config(run_dir / "config.yaml").data
    ids: list[int] = []
    for play in held_out_plays(run_dir, data):
        ids += tokenizer.encode(play.text).ids
        if len(ids) >= tokens:
            return ids[:tokens]
    raise UserError(f"{run_dir}'s held-out plays have {len(ids)} tokens, fewer than the {tokens} asked for; "
                    "lower --window-multiples")


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("streaming", __doc__)
    parser.add_argument("--run", type=path_arg, required=True,
                        help="a run with model.positions rope or none (required)")
    parser.add_argument("--window-multiples", type=positive_int, default=10,
                        help="the stream's length in windows (default: %(default)s)")
    parser.add_argument("--sinks", type=int, default=None,
                        help=f"the first tokens the rolling window keeps (default: the engine's, {SINKS} or a quarter "
                             f"of a window under {4 * SINKS})")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="generations timed per way, in turns; the best counts (default: %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    run = load_run(args.run, torch.device("cpu"))
    model, block = run.model, run.block_size
    positions = model.config.positions
    if positions == "learned":
        raise UserError(f"{args.run} has learned positions, which can only re-encode past the window; "
                        "benchmark a run trained with --set model.positions=rope (or none)")
    sinks = default_sinks(block) if args.sinks is None else args.sinks
    if not 0 <= sinks < block:
        raise UserError(f"--sinks must be 0 to {block - 1} (the window less one), got {sinks}")
    ids = stream_ids(args.run, run.tokenizer, args.window_multiples * block)
    token_bytes = [len(b) for b in run.token_bytes]
    rolling = Window.for_positions(positions, block, sinks=sinks)
    re_encode = Window.for_positions(positions, block, roll=False)
    reference = Window.for_positions(positions, block, keep_fraction=1.0, roll=False)
    print(f"{args.run} ({positions} positions, {model.config.attention}, {model.num_params() / 1e6:.1f}M "
          f"parameters, window {block}), a stream of {len(ids)} tokens ({args.window_multiples} windows) of its "
          f"held-out plays; rolling keeps {sinks} sinks and evicts down to {rolling.keep}; torch threads "
          f"{torch.get_num_threads()}, {os.cpu_count()} CPUs")
    scores = [score_stream(model, ids, token_bytes, reference, use_cache=False, name="reference"),
              score_stream(model, ids, token_bytes, rolling, use_cache=True, name="rolling"),
              score_stream(model, ids, token_bytes, re_encode, use_cache=True, name="re-encode")]
    prompt, new = ids[:block], len(ids) - block
    generation_speeds(model, prompt, min(new, block), 1, sinks)  # warm-up: first calls are slow
    speeds = generation_speeds(model, prompt, new, args.repeats, sinks)
    print_table(scores, speeds)
    return 0


def print_table(scores: list[StreamScore], speeds: dict[str, float]) -> None:
    reference = scores[0]
    mib = 2**20
    print("| way | bits/byte | vs reference | positions held (max) | cache MiB | RSS first -> last window MiB "
          "| scoring tokens/s | generating tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s in scores:
        rss = f"{s.rss[0] / mib:.1f} -> {s.rss[-1] / mib:.1f}" if s.rss and s.rss[0] else "n/a"
        print(f"| {s.name} | {s.bits_per_byte:.4f} | {s.bits_per_byte - reference.bits_per_byte:+.4f} | "
              f"{max(s.held)} | {s.cache_bytes / mib:.2f} | {rss} | {len(s.nats) / s.seconds:.0f} | "
              f"{speeds[s.name]:.0f} |")
    rolling = {s.name: s for s in scores}["rolling"]
    print(f"\nrolling: bits/byte {rolling.bits_per_byte / reference.bits_per_byte:.3f}x the reference's; "
          f"generating {speeds['rolling'] / speeds['re-encode']:.2f}x re-encoding's tokens/s and "
          f"{speeds['rolling'] / speeds['reference']:.2f}x the reference's; positions held at each window "
          f"{rolling.held}")


if __name__ == "__main__":
    sys.exit(main())
