"""The ``generate.py`` command line: parse and check flags, load a run, stream its continuation.

Flags are checked before anything is printed, so a failed command writes nothing to stdout."""

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from common.cli import ArgumentParser, Terminated, path_arg, run_command, terminated_raises
from common.device import select_device
from common.errors import UserError, describe_os_error
from common.threads import STARVED_SHARE, add_threads_argument, parse_threads, starved_advice, use_threads
from inference.completion import GenerationResult, encode_prompt, generate_completions
from inference.sampling import KEEP_FRACTION, SINKS
from inference.settings import (DEFAULT_MAX_CALLS, GenerationSettings, add_speculation_arguments, checked_sinks,
                                checked_speculation)
from inference.terminal import decode_argument, decode_utf8, write_stdout
from rundir.loading import find_latest_run, load_run

_EPILOG = f"""\
output:
  The prompt, then the continuation as it is generated, then a newline. Text is printed whole
  characters at a time (a character split across tokens waits for its last byte), and the printed
  continuation always equals the tokenizer's decode of the generated tokens. Special tokens are
  shown: <|endoftext|> is where the model ended a document. Statistics (tokens generated, time to
  first token, decode tokens/s, seed) go to stderr.

samples and seeds:
  --num-samples N decodes N continuations of the prompt as one batch through one cache. Sample i
  draws from a generator seeded SEED+i, so it equals the single run with --seed SEED+i; with
  --temperature 0 every sample is the greedy continuation. Samples are printed when all are done,
  each under a "--- sample i/N ---" header (use --json to read them from a script).

stop strings:
  With --stop STRING a sample ends as soon as STRING appears in its continuation; the printed text
  ends just before the stop string, which is not printed. --stop may be given several times.

context window:
  The model sees at most block_size tokens. A learned-position run reads a longer prompt's last
  block_size tokens (with a notice); when generation fills its window, the most recent tokens (a
  fraction {KEEP_FRACTION:g} of it) are re-encoded from position 0, since learned positions cannot slide;
  --no-cache recomputes exactly that window at every step, so both give the same tokens.
  A run with rotary or no positions rolls instead, through a long prompt as through the
  continuation: the cache keeps the first {SINKS} tokens (a quarter of a window under {4 * SINKS}) and the
  most recent ones, and evicts the middle, with nothing encoded again. There --no-cache gives the
  same tokens only inside the window: past it the cache's deeper entries were computed beside
  tokens since evicted, which a re-encoded window never saw (docs/training.md, "Positions").

speculative decoding:
  --speculate lookup guesses the next tokens from n-grams already in the prompt and reply (no second
  model); --speculate draft --draft-run DIR has a smaller run with the same tokenizer guess them.
  Each step checks up to --speculate-k guesses in one pass of the model and keeps those the model
  agrees with. Greedy output (--temperature 0) is plain decoding's token for token (the checking
  pass rounds apart from single steps in the last bits, as --no-cache does). Sampling keeps the
  distribution every setting gives (temperature, top-k, top-p, repetition penalty), but a seed draws
  other tokens than it does without speculation. It pays where the text repeats its input (a reply
  quoting or editing the prompt); on free text most guesses are rejected, and a draft spends a step
  of its own on each guess (python -m benchmarks.speculative measures both).

examples:
  python generate.py --prompt "ROMEO:"
  python generate.py --prompt "ROMEO:" --temperature 0 --max-new-tokens 100
  python generate.py --prompt-file prompt.txt --num-samples 4 --seed 1 --json
  python generate.py --prompt-file passage.txt --temperature 0 --speculate lookup
  python generate.py --run runs/tiny-tools --chat --tools calculator --prompt "What is 347*812?"
"""


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="generate.py",
        description="Continue a prompt with a trained model, streaming the text as it is generated.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # What to continue, and with which run on which device.
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--prompt", metavar="TEXT",
        help='text to continue; "-" reads it from stdin (UTF-8, verbatim: a trailing newline stays '
        "part of the prompt). Empty or left out: an unconditional sample, starting from <|endoftext|>",
    )
    source.add_argument("--prompt-file", metavar="PATH", type=path_arg, help="read the prompt from a UTF-8 file (verbatim)")
    parser.add_argument("--run", metavar="DIR", type=path_arg,
                        help="run directory to load (default: the most recently trained run under runs/)")
    add_threads_argument(parser)
    parser.add_argument("--device", default="auto",
                        help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps (default: %(default)s)")
    # How many tokens, drawn how; the defaults are GenerationSettings'.
    defaults = GenerationSettings()
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens, metavar="N",
                        help="tokens to generate per sample (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature, metavar="T",
                        help="sampling temperature; 0 = greedy, always the most likely token (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=defaults.top_k, metavar="K",
                        help="sample only from the K most likely tokens (default: off)")
    parser.add_argument("--top-p", type=float, default=defaults.top_p, metavar="P",
                        help="sample only from the smallest set of tokens whose probability reaches P; "
                        "1 turns it off (default: %(default)s)")
    parser.add_argument("--repetition-penalty", type=float, default=defaults.repetition_penalty, metavar="R",
                        help="divide positive logits (multiply negative ones) of tokens already in the text "
                        "by R; 1 = off (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=defaults.seed, metavar="S",
                        help="seed for reproducible sampling (default: a random seed, reported on stderr)")
    parser.add_argument("--num-samples", type=int, default=defaults.num_samples, metavar="N",
                        help="continuations of the prompt, decoded as one batch (default: %(default)s)")
    parser.add_argument("--stop", action="append", default=[], metavar="STRING",
                        help="end a sample when STRING appears; printed text ends before it (repeatable)")
    parser.add_argument("--no-cache", action="store_true",
                        help="recompute the whole window at every step instead of using the KV cache "
                        "(slow; the reference the cache is tested against: the same tokens, except past the "
                        "window of a rotary or no-position run; see below)")
    parser.add_argument("--sinks", type=int, default=None, metavar="N",
                        help=f"runs with rotary or no positions: the first tokens the window keeps when it rolls "
                             f"(default {SINKS}, a quarter of a window under {4 * SINKS})")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="compile the decode step (a one-off cost, reported on stderr; faster tokens after it). "
                        "On the CPU it is built ahead of time, tens of seconds, and kept in compile_cache/ "
                        "($MINIGPT_COMPILE_CACHE) for the next run of these weights; on a GPU torch.compile "
                        "records a CUDA graph. Default: off")
    add_speculation_arguments(parser)
    # Chat, and the shape of the output.
    parser.add_argument("--chat", action="store_true",
                        help="talk to a chat-tuned run: an interactive conversation (/help lists its commands), or one "
                        "reply to --prompt; replies end when the model ends its turn")
    parser.add_argument("--system", metavar="TEXT", help="with --chat: a system prompt, e.g. 'You are HAMLET.'")
    parser.add_argument("--tools", nargs="+", metavar="TOOL",
                        help="with --chat: tools the model may call, run as it calls them, each shown with its "
                        "result: calculator (built in) or module:function (a run fine-tuned with tools; "
                        "docs/training.md)")
    parser.add_argument("--max-tool-calls", type=int, default=DEFAULT_MAX_CALLS, metavar="N",
                        help="with --tools: the most calls in one reply; after them the model must answer "
                        "(default: %(default)s)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--quiet", action="store_true",
                        help="print only the generated text: no prompt echo, no headers, nothing on stderr but errors")
    output.add_argument("--json", action="store_true",
                        help="print one JSON object when done (prompt, samples with text, token ids, finish "
                        "reason and seed, statistics) instead of streaming text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (2 for a user error)."""
    if sys.stdout is None:  # started with stdout closed (`>&-`): nowhere to put the text
        print("error: standard output is closed; redirect it to a file or a pipe", file=sys.stderr)
        return 2
    try:
        with terminated_raises():
            return run_command(build_parser(), argv, _generate)
    except KeyboardInterrupt:
        print(file=sys.stderr)  # put the shell prompt back on a line of its own
        return 130
    except Terminated as stopped:
        return 128 + stopped.signum
    except BrokenPipeError:
        # The reader left (e.g. `| head`). Point stdout at devnull so the interpreter's final flush
        # does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as error:  # stdout on a full disk or /dev/full
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"error: cannot write the output: {describe_os_error(error, 'standard output')}", file=sys.stderr)
        return 2


def _generate(args: argparse.Namespace) -> int:
    settings = GenerationSettings(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        repetition_penalty=args.repetition_penalty, num_samples=args.num_samples, seed=args.seed,
        stop=tuple(decode_argument(stop, "--stop") for stop in args.stop), use_cache=not args.no_cache,
    )
    prompt = read_prompt(args)
    if args.chat:  # the chat (and its tools) is imported only when asked for
        from inference.chat_cli import check_chat_flags
        check_chat_flags(settings, args)
    elif args.system is not None or args.tools is not None:
        raise UserError(f"{'--system' if args.system is not None else '--tools'} needs --chat")

    device = select_device(args.device, setting="--device")
    if args.compile is not None:  # unasked, one generation never compiles (choose_compile)
        from inference.compiled_step import choose_compile
        settings = dataclasses.replace(settings, compile=choose_compile(
            args.compile, use_cache=settings.use_cache, device=device))
    # One stream decodes one token at a time: operations too small to share between cores.
    threads = use_threads(parse_threads(args.threads), useful=1 if args.chat or settings.num_samples == 1 else None)
    run = load_run(_run_directory(args), device)
    settings = dataclasses.replace(settings, sinks=checked_sinks(args.sinks, run.model.config),
                                   speculation=checked_speculation(args, run, use_cache=settings.use_cache))
    if args.chat:
        from inference.chat_cli import chat_main
        given = args.prompt is not None or args.prompt_file is not None
        return chat_main(args, run, settings, prompt if given else None)
    prompt_tokens = encode_prompt(run, prompt)
    if prompt_tokens.original_length > run.block_size and not args.quiet:
        seen = (f"it sees only the last {run.block_size}" if prompt_tokens.cropped else
                "it rolls through the cache, which keeps its first tokens and its most recent ones")
        print(f"notice: the prompt is {prompt_tokens.original_length} tokens, longer than the model's "
              f"{run.block_size}-token context; {seen}", file=sys.stderr)

    streaming = settings.num_samples == 1 and not args.json
    if streaming and not args.quiet:
        write_stdout(prompt)
    started, on_cpu = time.perf_counter(), time.thread_time()
    result = generate_completions(
        run, prompt_tokens.ids, settings, on_text=(lambda _row, text: write_stdout(text)) if streaming else None
    )
    share = (time.thread_time() - on_cpu) / max(time.perf_counter() - started, 1e-9)

    if args.json:
        report = _json_report(run.directory, prompt, prompt_tokens.ids, result)
        write_stdout(json.dumps(report, ensure_ascii=False) + "\n")
    elif streaming:
        write_stdout("\n")  # the text is out already; end its line
    elif args.quiet:
        write_stdout("".join(completion.text + "\n" for completion in result.completions))
    else:
        for number, completion in enumerate(result.completions, start=1):
            seed = "" if completion.seed is None else f" (seed {completion.seed})"
            write_stdout(f"--- sample {number}/{settings.num_samples}{seed} ---\n{prompt}{completion.text}\n")
    if not args.quiet:
        print(_stats_line(result, settings), file=sys.stderr)
        # Only a decode long enough to measure: the first tokens include one-off set-up. A step built
        # now kept this thread waiting on the compiler processes the command started, not on others.
        if device.type == "cpu" and result.stats.tokens_generated >= 32 and share < STARVED_SHARE \
                and not result.stats.compile_built:
            print(starved_advice(share, threads.threads), file=sys.stderr)
    return 0


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt text from --prompt, --prompt-file or stdin (--prompt -); empty if none given."""
    if args.prompt_file is not None:
        try:
            data = args.prompt_file.read_bytes()
        except OSError as error:
            raise UserError(
                f"cannot read prompt file {args.prompt_file}: {error.strerror}; check the path"
            ) from None
        source = f"prompt file {args.prompt_file}"
    elif args.prompt == "-":
        data = sys.stdin.buffer.read()
        source = "the prompt on stdin"
    else:
        return decode_argument(args.prompt or "", "--prompt")
    return decode_utf8(data, source)


def _run_directory(args: argparse.Namespace) -> Path:
    """--run, or else the newest run under runs/, named on stderr: after a fine-tune that is the
    chat run, which may not be the one meant."""
    if args.run is not None:
        return args.run
    directory = find_latest_run()
    if not args.quiet:
        print(f"using {directory}, the most recently trained run (choose another with --run)", file=sys.stderr)
    return directory


def _json_report(run_dir: Path, prompt: str, prompt_ids: list[int], result: GenerationResult) -> dict:
    stats = result.stats
    return {
        "run": str(run_dir),
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "samples": [dataclasses.asdict(completion) for completion in result.completions],
        "tokens_generated": stats.tokens_generated,
        "time_to_first_token_s": stats.time_to_first_token_s,
        "decode_tokens_per_s": stats.decode_tokens_per_s,
    }


def _stats_line(result: GenerationResult, settings: GenerationSettings) -> str:
    stats = result.stats
    parts = [f"generated {stats.tokens_generated} tokens"]
    if stats.rows > 1:
        parts[0] += f" ({stats.rows} samples x {stats.steps})"
    if stats.time_to_first_token_s is not None:
        parts.append(f"time to first token {stats.time_to_first_token_s * 1000:.1f} ms")
    if stats.decode_tokens_per_s is not None:
        parts.append(f"decode {stats.decode_tokens_per_s:.1f} tokens/s")
    if not settings.greedy:
        parts.append(f"seed {result.seed}")
    if not settings.use_cache:
        parts.append("no cache")
    if stats.compile_notice is not None:
        parts.append(stats.compile_notice)
    if settings.speculation is not None:
        parts.append(f"speculative ({settings.speculation.proposer}, up to {settings.speculation.k} guesses a step)")
    return " | ".join(parts)
