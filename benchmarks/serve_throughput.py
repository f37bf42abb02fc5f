"""Serving throughput: concurrent streaming clients against the same requests served one at a time.

    python -m benchmarks.serve_throughput --run runs/tiny
    python -m benchmarks.serve_throughput --run runs/tiny --clients 1 16 --requests 16 --max-tokens 32

The same list of requests (Shakespeare prompts, temperature 0.8, top_p 0.95, one seed each) is
served by N closed-loop clients for each N in --clients: a client sends its next request when its
last one has finished. One client is the one-at-a-time baseline. Each level is measured twice:

- engine: ``inference.engine.Engine`` driven in this process, no HTTP;
- http: ``serve.py`` in a subprocess on 127.0.0.1, clients streaming Server-Sent Events with httpx.

Reported: generated tokens/s over the level's wall time, its ratio to one client, and p50/p95 time
to first token and inter-token latency (for http, between text chunks).

``--compile both`` also prints compiled over eager level by level with the one-off compile time:
whether a server repays its compile."""

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from benchmarks.shared import Request, Timing, api_settings, benchmark_parser, closed_loop, ms_quantiles, table
from common.cli import path_arg, positive_int, run_command
from common.threads import thread_count
from inference.engine import Engine, decode
from inference.sampling import SamplingSettings
from rundir.loading import load_run

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo,", "KING LEAR:\n", "First Citizen:\nBefore we proceed",
           "HAMLET:\nTo be, or not", "MACBETH:\nIs this a dagger", "PORTIA:\nThe quality of mercy",
           "PROSPERO:\nWe are such stuff"]


@dataclass(frozen=True)
class Level:
    clients: int
    tokens: int
    seconds: float
    ttft: list[float]
    itl: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def requests(count: int, max_tokens: int) -> list[tuple[str, SamplingSettings]]:
    return [(PROMPTS[i % len(PROMPTS)], api_settings(max_tokens, 0.8, 0.95, seed=i)) for i in range(count)]


def run_generate(run, work) -> float:
    """Tokens/s of the same requests through generate.py's decoding, one after another: the engine
    stepped on this thread, one row, no server."""
    tokens, start = 0, time.perf_counter()
    for prompt, params in work:
        finish, = decode(run.model, [run.tokenizer.encode(prompt).ids], params)
        tokens += finish.completion_tokens
    return tokens / (time.perf_counter() - start)


def summarize(clients: int, timings: list[Timing], seconds: float) -> Level:
    ttft = [t.stamps[0] - t.submitted for t in timings if t.stamps]
    itl = [b - a for t in timings for a, b in zip(t.stamps, t.stamps[1:])]
    return Level(clients, sum(t.tokens for t in timings), seconds, ttft, itl)


def run_engine(run, work, clients: int, max_batch: int, compile: bool = False) -> Level:
    queues = [work[c::clients] for c in range(clients)]

    def next_request(client: int, finish) -> "Request | None":
        if not queues[client]:
            return None
        prompt, params = queues[client].pop(0)
        return run.tokenizer.encode(prompt).ids, params, ()

    with Engine(run.model, run.token_bytes, max_batch=max_batch, compile=compile) as engine:
        timings, seconds = closed_loop(engine, clients, next_request)
    return summarize(clients, timings, seconds)


async def _http_level(base: str, model: str, work, clients: int) -> Level:
    timings: list[Timing] = []

    async def client(http: httpx.AsyncClient, queue) -> None:
        for prompt, params in queue:
            body = {"model": model, "prompt": prompt, "max_tokens": params.max_new_tokens, "stream": True,
                    "temperature": params.temperature, "top_p": params.top_p, "seed": params.seed,
                    "stream_options": {"include_usage": True}}
            timing = Timing(time.perf_counter())
            timings.append(timing)
            async with http.stream("POST", "/v1/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        timing.tokens = chunk["usage"]["completion_tokens"]
                    elif chunk["choices"] and chunk["choices"][0]["text"]:
                        timing.stamps.append(time.perf_counter())

    async with httpx.AsyncClient(base_url=base, timeout=600, limits=httpx.Limits(max_connections=clients)) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http, work[c::clients]) for c in range(clients)))
        seconds = time.perf_counter() - start
    return summarize(clients, timings, seconds)


@contextlib.contextmanager
def server(run_dir: Path, max_batch: int, threads: int, device: str = "cpu", compile: bool = False):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "serve.py", "--run", str(run_dir), "--port", str(port), "--device", device,
               "--max-batch", str(max_batch), "--max-queue", "1000", "--threads", str(threads),
               "--compile" if compile else "--no-compile"]
    process = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1], stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield base
    finally:
        process.kill()
        process.wait()


def print_table(title: str, levels: list[Level]) -> None:
    base = levels[0].tokens_per_s if levels and levels[0].clients == 1 else None
    print(f"\n{title}")
    print(table(("clients", "tokens", "seconds", "tokens/s", "x one at a time", "TTFT p50 / p95 ms", "ITL p50 / p95 ms"),
                ((level.clients, level.tokens, f"{level.seconds:.2f}", f"{level.tokens_per_s:.0f}",
                  f"{level.tokens_per_s / base:.2f}" if base else "-", ms_quantiles(level.ttft), ms_quantiles(level.itl))
                 for level in levels), left=0))


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("serve_throughput", __doc__)
    parser.add_argument("--run", type=path_arg, required=True, help="run directory written by train.py (required)")
    parser.add_argument("--clients", type=positive_int, nargs="+", default=[1, 4, 16, 32],
                        help="concurrency levels measured (default: %(default)s)")
    parser.add_argument("--requests", type=positive_int, default=32,
                        help="requests served at every level (default: %(default)s)")
    parser.add_argument("--max-tokens", type=positive_int, default=64,
                        help="tokens generated per request (default: %(default)s)")
    parser.add_argument("--max-batch", type=positive_int, default=32,
                        help="the engine's rows, as serve.py --max-batch (default: %(default)s)")
    parser.add_argument("--only", choices=["engine", "http"], default=None,
                        help="measure only the engine or only over HTTP (default: both)")
    parser.add_argument("--threads", type=thread_count, default=1,
                        help="torch threads, as serve.py --threads (default: %(default)s)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the model runs (default: %(default)s)")
    parser.add_argument("--compile", choices=["off", "on", "both"], default="off",
                        help="serve with the compiled decode step (serve.py --compile); both: eager, then compiled "
                        "(default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    run = load_run(args.run, device)
    work = requests(args.requests, args.max_tokens)
    model_id = args.run.resolve().name
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    print(f"run {args.run} ({run.model.num_params() / 1e6:.2f}M parameters) on {device}, {args.requests} requests x "
          f"{args.max_tokens} tokens, max batch {args.max_batch}, torch threads {torch.get_num_threads()}, "
          f"{os.cpu_count()} CPUs")
    if args.only != "http":
        tables = {}
        for compile in modes:
            started = time.perf_counter()
            run_engine(run, work[:4], 4, args.max_batch, compile)  # warm-up (and the compile, once)
            warm_up = time.perf_counter() - started
            tables[compile] = [run_engine(run, work, c, args.max_batch, compile) for c in args.clients]
            print_table(f"engine, {'compiled' if compile else 'eager'} (warm-up {warm_up:.1f} s)", tables[compile])
        if len(tables) == 2:
            print("\ncompiled over eager: " + ", ".join(
                f"{c.clients} clients {c.tokens_per_s / e.tokens_per_s:.2f}x" for e, c in zip(tables[False], tables[True])))
        alone = run_generate(run, work)
        levels = tables[modes[0]]
        print(f"\ngenerate.py's decoding, one request at a time, no engine: {alone:.0f} tokens/s; "
              + ", ".join(f"{level.clients} clients {level.tokens_per_s / alone:.2f}x that" for level in levels))
    if args.only != "engine":
        for compile in modes:
            with server(args.run, args.max_batch, args.threads, args.device, compile) as base:
                asyncio.run(_http_level(base, model_id, work[:4], 4))  # warm-up
                print_table(f"http, {'compiled' if compile else 'eager'}",
                            [asyncio.run(_http_level(base, model_id, work, c)) for c in args.clients])
    return 0


if __name__ == "__main__":
    sys.exit(main())
