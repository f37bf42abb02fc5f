"""The ``serve.py`` command line: load a run, start the engine, serve the OpenAI API with uvicorn.

User errors (a bad flag, a missing run, a port in use, a KV cache larger than the device's memory)
exit 2 with one line; Ctrl-C and SIGTERM stop the server gracefully (130, 143). It binds to
127.0.0.1 unless told otherwise: anyone who can reach the port can use it."""

import argparse
import contextlib
import ipaddress
import logging
import socket
import sys
from typing import Sequence

import torch
import uvicorn

from common.cli import ArgumentParser, path_arg, run_stoppable
from common.device import DEVICE_CHOICES, device_memory_bytes, select_device
from common.errors import UserError
from common.threads import add_threads_argument, parse_threads, use_threads
from inference.compiled_step import choose_compile
from inference.engine import DEFAULT_PREFILL_CHUNK, Engine
from inference.sampling import SINKS
from inference.settings import add_speculation_arguments, checked_sinks, checked_speculation
from model.gpt import GPT
from rundir.loading import find_latest_run, load_run
from serving.api import access_log, create_app
from serving.service import Limits

_EPILOG = """\
endpoints:
  GET  /                     the chat page, for a browser
  GET  /health               liveness, and how many requests are running and waiting
  GET  /v1/models            the one model served (its id is the run directory's name)
  POST /v1/completions       continue a prompt
  POST /v1/chat/completions  reply to a conversation (runs whose tokenizer has the chat tokens)

examples:
  python serve.py --run runs/tiny
  python serve.py --run runs/tiny --port 8080 --max-batch 32
  python serve.py --run runs/tiny --speculate lookup
  curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "tiny", "prompt": "ROMEO:", "max_tokens": 40}'
"""


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="serve.py",
        description="Serve a trained run through an OpenAI-compatible HTTP API, batching concurrent "
        "requests through one KV cache.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--run", type=path_arg, metavar="DIR",
                        help="run directory to serve (default: the most recently trained run under runs/)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: %(default)s, this machine only; 0.0.0.0 "
                        "exposes the server to the network, with no authentication)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    parser.add_argument("--max-batch", type=int, default=16, metavar="N",
                        help="requests decoded at once, one KV cache row each (default: %(default)s)")
    parser.add_argument("--max-queue", type=int, default=None, metavar="N",
                        help="requests that may wait for a row; more are refused with 503 "
                        "(default: 4 x --max-batch)")
    parser.add_argument("--max-tokens-cap", type=int, default=2048, metavar="N",
                        help="the largest max_tokens a request may ask for (default: %(default)s)")
    parser.add_argument("--max-body-bytes", type=int, default=Limits.max_body_bytes, metavar="N",
                        help="the largest request body read; larger ones are refused with 413 "
                        "(default: %(default)s)")
    parser.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK, metavar="N",
                        help="encode prompts in chunks of N tokens, between decode steps of the other "
                        "requests; also the prefix cache's page (default: %(default)s)")
    parser.add_argument("--prefix-cache-mb", type=float, default=256, metavar="MB",
                        help="memory for recent prompts' pages (their KV entries and the index that finds "
                        "them), reused by prompts that begin alike, least recently used evicted first; 0 "
                        "turns it off (default: %(default)s)")
    parser.add_argument("--sinks", type=int, default=None, metavar="N",
                        help=f"runs with rotary or no positions: the first tokens a row's window keeps when it "
                             f"rolls past the context (default {SINKS}, a quarter of a window under {4 * SINKS})")
    parser.add_argument("--device", default="auto", help=f"{DEVICE_CHOICES} (default: %(default)s)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="compile the decode step before serving (a one-off cost, reported on stderr). "
                        "Default: on CUDA, where it pays (a CUDA graph per step); off on the CPU, where it is "
                        "built ahead of time and kept in compile_cache/ ($MINIGPT_COMPILE_CACHE)")
    add_speculation_arguments(parser)
    add_threads_argument(parser, default="1", why=": a decode step of a small model is too "
                         "short to share between cores, and the HTTP layer needs a core of its own")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # uvicorn shuts down gracefully on Ctrl-C or SIGTERM, then raises the signal again through the
    # handler in place before it started: run_stoppable's, so the command exits 130 or 143 as the
    # others do (with asyncio's own Ctrl-C handler in its place, a stopped server exited 0).
    return run_stoppable(build_parser(), argv, _serve)


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {args.port}")
    for flag, value in (("--max-batch", args.max_batch), ("--max-tokens-cap", args.max_tokens_cap),
                        ("--max-body-bytes", args.max_body_bytes), ("--prefill-chunk", args.prefill_chunk)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    if args.max_queue is not None and args.max_queue < 0:
        raise UserError(f"--max-queue must be >= 0, got {args.max_queue}")
    parse_threads(args.threads)
    if not 0 <= args.prefix_cache_mb < float("inf"):
        raise UserError(f"--prefix-cache-mb must be 0 (off) or more, got {args.prefix_cache_mb}")


def _serve(args: argparse.Namespace) -> int:
    _check(args)
    _check_port_free(args.host, args.port)
    device = select_device(args.device, setting="--device")
    compile = choose_compile(args.compile, device=device, serving=True)
    use_threads(parse_threads(args.threads))
    run = load_run(args.run if args.run is not None else find_latest_run(), device)
    _check_cache_fits(run.model, args.max_batch, device)
    sinks = checked_sinks(args.sinks, run.model.config)
    speculation = checked_speculation(args, run)
    if compile:  # tens of seconds before the server listens: say why it is waiting
        print(f"compiling the decode step for {device} (--no-compile skips it)...", file=sys.stderr, flush=True)
    engine = Engine(run.model, run.token_bytes, max_batch=args.max_batch, max_queue=args.max_queue,
                    prefill_chunk=args.prefill_chunk, prefix_cache_bytes=int(args.prefix_cache_mb * 2**20),
                    sinks=sinks, compile=compile, speculation=speculation)
    if engine.compiled is not None:
        print(engine.compiled.notice, file=sys.stderr, flush=True)
    model_id = run.directory.resolve().name
    app = create_app(run, engine, model_id=model_id, limits=Limits(max_tokens_cap=args.max_tokens_cap,
                                                                         max_body_bytes=args.max_body_bytes))
    if not _is_loopback(args.host):
        print(f"warning: listening on {args.host}: anyone who can reach this port can use the model",
              file=sys.stderr)
    base = f"http://{_url_host(args.host)}:{args.port}"
    print(f"serving {run.directory} as model {model_id!r} at {base}/v1 (max batch {args.max_batch})\n"
          f"chat page: {base}/", file=sys.stderr, flush=True)
    if speculation is not None:
        print(f"speculative decoding: {speculation.proposer}, up to {speculation.k} guesses a step",
              file=sys.stderr, flush=True)
    _log_requests_to_stderr()
    # uvicorn.run would turn a Ctrl-C that comes while the server starts into exit code 3.
    uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")).run()
    return 0


def _url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets."""
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    return host


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_port_free(host: str, port: int) -> None:
    """A port in use becomes a one-line error before the model loads, not a uvicorn traceback."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise UserError(f"--host {host} is not an address of this machine ({error.strerror})") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise UserError(f"cannot listen on {host}:{port} ({error.strerror}); pass another --port "
                            "or stop the program using it") from None


def _check_cache_fits(model: GPT, max_batch: int, device: torch.device) -> None:
    """A --max-batch whose KV cache cannot fit becomes one line, not an allocator traceback."""
    row = model.init_cache(1).nbytes()
    need, have = row * max_batch, device_memory_bytes(device)
    if have is not None and need > have:
        raise UserError(f"--max-batch {max_batch} needs a KV cache of {need / 2**30:,.1f} GiB "
                        f"({row / 2**20:,.2f} MiB a row), more than the {have / 2**30:,.1f} GiB of {device}; "
                        f"pass --max-batch {have // row} or less")


def _log_requests_to_stderr() -> None:
    if not access_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        access_log.addHandler(handler)
        access_log.setLevel(logging.INFO)
