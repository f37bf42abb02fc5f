"""Chat quality of runs on held-out plays: assistant-text bits/byte, and how often a reply ends.

    python -m benchmarks.chat_eval --runs runs/tiny runs/tiny-chat [--replies 200] [--transcript]

For each run (a pretrained one and its chat fine-tune, say), on the held-out conversations of
``configs/tiny-chat.yaml``'s data (the Shakespeare chat set's held-out plays, tokenized with the
run's tokenizer and its window):

- bits per byte of assistant text (each reply's text, its <|end|> charged: ``training.tasks.chat``'s
  evaluation, as a chat run's final validation scores it), over every held-out conversation;
- the share of replies to held-out user turns (the first exchange of ``--replies`` conversations
  spread evenly over the split) that end with <|end|> within ``--max-new-tokens`` tokens or the
  window, sampled as ``generate.py --chat`` samples by default (temperature 0.8, top-p 0.95, role
  tokens suppressed; reply i seeded ``--seed`` + i), and greedily. With the defaults, the sampled
  share is the one a chat run's summary reports (``training.tasks.chat.held_out_replies``);
- the share of those replies that repeat a 4-gram of words (``data.repetition``): replies that loop;
- the mean length in tokens of the replies that ended, sampled and greedy, and the share of greedy
  replies that are distinct: beside the bits/byte, they tell a fine-tune that stopped loops from one
  that taught the model to say almost nothing, or one thing to everyone."""

import argparse
import statistics
from dataclasses import dataclass

import torch

from benchmarks.shared import benchmark_parser, table
from common.cli import non_negative_int, path_arg, positive_int, run_command
from common.threads import add_threads_argument, parse_threads, use_threads
from data.chat import ChatTokenIds
from data.config import DataConfig
from data.prepared.chat import prepare_chat_data
from data.repetition import repeats_ngram
from inference.chat import ChatSession
from inference.settings import GenerationSettings
from inference.sampling import SamplingSettings
from rundir.loading import load_run
from training.distributed import DistContext
from training.tasks.chat import (
    ENDING_MAX_TOKENS, ENDING_REPLIES, ENDING_SEED, ended_share, evaluate_chat, held_out_replies, held_out_rows,
)

TRANSCRIPT_SYSTEM = "You are HAMLET in Hamlet."
TRANSCRIPT = ["Who's there?", "My lord, the king your father is dead.", "What will you do now?"]


@dataclass
class Replies:
    ended: float  # share of replies that end with <|end|> within the budget
    repeated: float  # share of replies that repeat a 4-gram of words
    mean_ended_tokens: float  # mean length of the replies that ended
    distinct: float  # share of the replies whose text no earlier reply had


@dataclass
class Row:
    run: str
    bpb: float
    sampled: Replies
    greedy: Replies


def reply_measures(run, split, max_new_tokens: int, temperature: float, count: int, seed: int) -> Replies:
    """How the replies to ``count`` held-out conversations of ``split`` end, and how many loop."""
    special = ChatTokenIds.of(run.tokenizer)
    finishes = held_out_replies(run.model, split, special, count=count, max_new_tokens=max_new_tokens,
                                temperature=temperature, seed=seed, token_bytes=run.token_bytes)
    if not finishes:  # no held-out prompt fits the window
        return Replies(*[float("nan")] * 4)
    lengths = [f.completion_tokens for f in finishes if f.token_ids and f.token_ids[-1] == special.end]
    return Replies(ended_share(finishes, special), sum(repeats_ngram(f.text) for f in finishes) / len(finishes),
                   statistics.mean(lengths) if lengths else float("nan"),
                   len({finish.text for finish in finishes}) / len(finishes))


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser("chat_eval", __doc__)
    parser.add_argument("--runs", type=path_arg, nargs="+", required=True,
                        help="the runs compared, the first the baseline of the last column (required)")
    parser.add_argument("--cache-dir", default="data_cache",
                        help="where the held-out conversations are prepared (default: %(default)s)")
    parser.add_argument("--replies", type=positive_int, default=ENDING_REPLIES,
                        help="held-out user turns replied to (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=ENDING_MAX_TOKENS,
                        help="the most tokens of a reply (default: %(default)s)")
    parser.add_argument("--seed", type=non_negative_int, default=ENDING_SEED,
                        help="reply i is sampled from seed + i (default: %(default)s)")
    parser.add_argument("--transcript", action="store_true", help="add a short conversation with each run")
    add_threads_argument(parser)
    return run_command(parser, argv, compare_runs)


def compare_runs(args: argparse.Namespace) -> int:
    use_threads(parse_threads(args.threads))
    device = torch.device("cpu")
    rows: list[Row] = []
    for directory in args.runs:
        run = load_run(directory, device)
        data = prepare_chat_data(DataConfig(format="chat", cache_dir=args.cache_dir), directory / "tokenizer.json",
                                 run.block_size, progress=False)
        token_bytes = torch.as_tensor(data.token_bytes(), dtype=torch.long)
        result = evaluate_chat(run.model, data.val, token_bytes, batch_size=32, max_batches=None,
                               pad_id=data.eot_id, device=device, ctx=DistContext())
        sampled, greedy = (reply_measures(run, data.val, args.max_new_tokens, temperature, args.replies, args.seed)
                           for temperature in (SamplingSettings.temperature, 0.0))
        rows.append(Row(str(directory), result.bpb, sampled, greedy))
        print(f"{directory}: {len(data.val)} held-out conversations ({data.meta['val_from']}), "
              f"{result.tokens:,} assistant tokens scored, {len(held_out_rows(data.val, args.replies))} replies",
              flush=True)
        if args.transcript:
            session = ChatSession(run, GenerationSettings(seed=args.seed, max_new_tokens=args.max_new_tokens),
                                  system_prompt=TRANSCRIPT_SYSTEM,
                                  on_notice=lambda message: print(f"  (notice: {message})"))
            print(f"  system: {TRANSCRIPT_SYSTEM}")
            for message in TRANSCRIPT:
                reply = session.reply(message)
                print(f"  user: {message}\n  assistant: " + reply.text.replace("\n", "\n             ")
                      + ("" if reply.finish_reason == "end" else "  [no <|end|>]"))

    first = rows[0]
    print()
    print(table(("run", "assistant bits/byte", "ended with <|end|> (sampled)", "ended (greedy)",
                 "repeated 4-gram (sampled)", "repeated (greedy)", "mean reply tokens (sampled)", "(greedy)",
                 "distinct (greedy)", "bits/byte vs first"),
                ((row.run, f"{row.bpb:.3f}", f"{100 * s.ended:.1f}%", f"{100 * g.ended:.1f}%", f"{100 * s.repeated:.1f}%",
                  f"{100 * g.repeated:.1f}%", f"{s.mean_ended_tokens:.1f}", f"{g.mean_ended_tokens:.1f}",
                  f"{100 * g.distinct:.1f}%", f"{row.bpb / first.bpb:.3f}")
                 for row in rows for s, g in [(row.sampled, row.greedy)])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
