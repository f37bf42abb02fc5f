"""The prefix cache on a multi-turn chat workload: prefill work, time to first token, tokens/s.

    python -m benchmarks.prefix_cache --config configs/small.yaml     # random weights of that shape
    python -m benchmarks.prefix_cache --run runs/tiny-chat            # a chat-tuned run

Every client holds one conversation: a system prompt all clients share, then ``--turns`` user
messages (lines of the plays). Each turn resends the whole conversation so far, rendered in the
chat format, the reply of the turn before included as its text, as an OpenAI chat client does;
the client sends its next turn as soon as its reply has ended. The same conversations are served
by the in-process engine (no HTTP) with the prefix cache off and on; the replies must come out
the same (the cache never changes a token), which the script checks.

Sizes follow the model's context (``block_size``): a system prompt of a quarter of it, user
messages and replies of a sixteenth, so the last turn fits. A random-weight model gets a BPE
tokenizer with the chat tokens trained here on the plays, with the config's vocabulary size."""

import argparse
import os
import statistics
import sys
from dataclasses import dataclass, field

import torch
from tokenizers import Tokenizer

from benchmarks.shared import Request, api_settings, benchmark_parser, closed_loop, ms_quantiles, table
from common.cli import path_arg, positive_float, positive_int, run_command
from common.threads import thread_count
from data.chat import ChatTokenIds, Message, render_chat
from data.sources.shakespeare import shakespeare_documents
from data.tokenizer import token_byte_table, train_tokenizer
from model.gpt import GPT
from rundir.loading import load_run
from inference.engine import Engine
from training.config import load_run_config


@dataclass
class Conversation:
    system: str
    questions: list[str]
    messages: list[Message] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)


@dataclass
class Mode:
    name: str
    prompt_tokens: int = 0
    computed: int = 0  # prompt tokens the model encoded
    cached: int = 0
    generated: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)
    replies: list[list[str]] = field(default_factory=list)


def play_lines(count: int, tokenizer: Tokenizer, tokens: int, plays: list[str]) -> list[str]:
    """``count`` passages of ``tokens`` tokens each, cut from the plays' lines in order."""
    lines = [line.strip() for play in plays for line in play.splitlines() if len(line.strip()) > 20]
    passages, current = [], ""
    for line in lines:
        current = f"{current} {line}".strip()
        ids = tokenizer.encode(current).ids
        if len(ids) >= tokens:
            passages.append(tokenizer.decode(ids[:tokens]))
            current = ""
            if len(passages) == count:
                break
    return passages


def conversations(tokenizer: Tokenizer, block: int, clients: int, turns: int, plays: list[str]) -> list[Conversation]:
    system = play_lines(1, tokenizer, block // 4, plays)[0]
    questions = play_lines(clients * turns, tokenizer, block // 16, plays[1:])
    return [Conversation(system, questions[c * turns:(c + 1) * turns]) for c in range(clients)]


def serve(model: GPT, tokenizer: Tokenizer, token_bytes: list[bytes], talks: list[Conversation], *,
          cache_bytes: int, max_batch: int, reply_tokens: int, name: str) -> Mode:
    """Closed-loop: each client's reply sends its next turn; returns the mode's measurements."""
    mode = Mode(name, replies=[[] for _ in talks])
    chat = ChatTokenIds.of(tokenizer)

    def next_turn(client: int, finish) -> "Request | None":
        talk, replies = talks[client], mode.replies[client]
        if finish is not None:
            mode.prompt_tokens += finish.prompt_tokens
            mode.cached += finish.cached_tokens
            mode.generated += finish.completion_tokens
            replies.append(finish.text)
        turn = len(replies)
        if turn == len(talk.questions):
            return None
        messages = [Message("system", talk.system)]
        for question, reply in zip(talk.questions, replies):
            messages += [Message("user", question), Message("assistant", reply)]
        messages.append(Message("user", talk.questions[turn]))
        ids = render_chat(tokenizer, messages, add_generation_prompt=True).ids
        params = api_settings(reply_tokens, 0.8, 0.95, seed=1000 * client + turn, suppress_ids=chat.suppress_ids)
        return ids, params, chat.reply_end_ids

    engine = Engine(model, token_bytes, max_batch=max_batch, max_queue=len(talks), prefix_cache_bytes=cache_bytes)
    with engine:
        timings, mode.seconds = closed_loop(engine, len(talks), next_turn)
        mode.computed = engine.prefill_tokens
    mode.ttft = [t.stamps[0] - t.submitted for t in timings if t.stamps]
    return mode


def load_model(args) -> tuple[GPT, Tokenizer, list[bytes], str]:
    if args.run is not None:
        run = load_run(args.run, torch.device("cpu"))
        return run.model, run.tokenizer, run.token_bytes, f"run {args.run}"
    config = load_run_config(args.config).model
    _, plays = shakespeare_documents()
    tokenizer = train_tokenizer(plays[:8], config.vocab_size)
    torch.manual_seed(0)
    model = GPT(config).eval()
    return model, tokenizer, token_byte_table(tokenizer), f"random weights of {args.config}'s shape"


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("prefix_cache", __doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=path_arg, help="a chat-tuned run directory (this or --config is required)")
    source.add_argument("--config", type=path_arg,
                        help="a config whose model shape gets random weights (this or --run is required)")
    parser.add_argument("--clients", type=positive_int, default=16,
                        help="conversations served at once (default: %(default)s)")
    parser.add_argument("--turns", type=positive_int, default=4,
                        help="turns of each conversation (default: %(default)s)")
    parser.add_argument("--reply-tokens", type=positive_int, default=None,
                        help="tokens per reply (default: block_size / 16)")
    parser.add_argument("--cache-mb", type=positive_float, default=256,
                        help="the prefix cache's memory, as serve.py --prefix-cache-mb (default: %(default)s)")
    parser.add_argument("--threads", type=thread_count, default=1,
                        help="torch threads, as serve.py --threads (default: %(default)s)")
    return run_command(parser, argv, measure)


def measure(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)

    model, tokenizer, token_bytes, what = load_model(args)
    block = model.config.block_size
    reply_tokens = args.reply_tokens or block // 16
    _, plays = shakespeare_documents()
    talks = conversations(tokenizer, block, args.clients, args.turns, plays[8:])
    print(f"{what} ({model.num_params() / 1e6:.1f}M parameters, context {block}), {args.clients} clients x "
          f"{args.turns} turns, replies up to {reply_tokens} tokens, max batch {args.clients}, torch threads "
          f"{torch.get_num_threads()}, {os.cpu_count()} CPUs")
    options = dict(max_batch=args.clients, reply_tokens=reply_tokens)
    with torch.inference_mode():
        serve(model, tokenizer, token_bytes, talks[:2], cache_bytes=0, **options, name="warm-up")
        modes = [serve(model, tokenizer, token_bytes, talks, cache_bytes=0, **options, name="off"),
                 serve(model, tokenizer, token_bytes, talks, cache_bytes=int(args.cache_mb * 2**20), **options,
                       name="on")]
    print(table(("prefix cache", "prompt tokens", "prefill tokens computed", "cached", "TTFT p50 / p95 ms", "tokens/s",
                 "seconds"), ((mode.name, mode.prompt_tokens, mode.computed, mode.cached, ms_quantiles(mode.ttft),
                               f"{mode.generated / mode.seconds:.0f}", f"{mode.seconds:.1f}") for mode in modes)))
    off, on = modes
    speedup = (on.generated / on.seconds) / (off.generated / off.seconds)
    print(f"\nprefill tokens {off.computed / on.computed:.2f}x fewer, p50 TTFT "
          f"{statistics.median(off.ttft) / statistics.median(on.ttft):.2f}x lower, tokens/s {speedup:.2f}x; "
          f"same replies: {off.replies == on.replies}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
