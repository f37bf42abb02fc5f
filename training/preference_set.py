"""The built-in preference set: a chat run's own replies, those that end well against those that loop.

    python -m training.preference_set --run runs/tiny-chat --out data/preferences-tiny-chat.jsonl

For each user turn of the Shakespeare chat set (its first exchange, the prompt rendered and cut by
the chat format as a chat is), the run samples ``--samples`` replies through the inference engine,
as ``generate.py --chat`` samples them (temperature 0.8, top-p 0.95, role tokens suppressed,
seeded). A reply is

- good when it ends with ``<|end|>`` within ``--max-new-tokens`` and repeats no 4-gram of words
  (``data.repetition``);
- bad when it loops (repeats a 4-gram).

A prompt with at least one of each gives one pair, written as a TRL conversational row that
``data.format: preference`` reads. The pair teaches the loop, not the length: the rejected reply is
cut where its first repeat completes (``data.repetition.looping_prefix``), and the chosen one is the
good reply closest to it in words. A reply that runs on to the budget without looping is never
rejected: the chat format ends every rendered reply with ``<|end|>``, so such a pair would only say
"shorter", and DPO then learns to end replies early rather than to stop loops. No network, no other
model: what DPO then teaches is measured by ``python -m benchmarks.chat_eval`` (the share of replies
that end, and of those that repeat a 4-gram).

The prompts come from the plays the chat run trained on (``--split train``, the default), so the
held-out plays that ``benchmarks.chat_eval`` replies to stay unseen by DPO too.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from common.cli import ArgumentParser, path_arg, run_command
from common.errors import UserError
from common.files import atomic_write_text
from data.chat import ChatTokenIds, ChatTooLong, Message, fit_for_reply
from data.config import DataConfig
from data.repetition import looping_prefix, repeats_ngram
from data.sources.conversations import load_conversations
from data.sources.preferences import PreferencePair
from inference.engine import Finish, decode
from inference.sampling import SamplingSettings
from model.gpt import eval_mode
from rundir.loading import LoadedRun, load_run

ROWS_PER_DECODE = 256  # replies decoded together: one engine, one cache of this many rows


@dataclass(frozen=True)
class SetSettings:
    prompts: int = 200  # user turns spread evenly over the split (those too long for the window are left out)
    samples: int = 6  # replies sampled per prompt
    max_new_tokens: int = 40  # a budget well past a chat run's usual reply, so a reply that reaches it runs on
    temperature: float = 0.8  # generate.py --chat's: the replies users see
    top_p: float | None = 0.95
    seed: int = 0


@dataclass
class PreferenceSet:
    pairs: list[PreferencePair]
    prompts: int  # prompts replied to
    replies: int
    good: int  # replies that ended within the budget with no repeated 4-gram
    looped: int  # replies that repeated a 4-gram
    ran_on: int  # replies that reached the budget without ending

    def mean_words(self, side: str) -> float:
        """The mean length in words of the pairs' ``side`` ("chosen" or "rejected") replies."""
        texts = [getattr(pair, side)[0].content for pair in self.pairs]
        return sum(len(text.split()) for text in texts) / max(len(texts), 1)


def first_exchange_prompts(split: str, count: int) -> list[list[Message]]:
    """The messages before the first reply of ``count`` conversations spread evenly over ``split``
    of the Shakespeare chat set (split as ``configs/tiny-chat.yaml`` splits it)."""
    conversations = load_conversations(DataConfig(source="shakespeare", format="chat"))
    chosen = conversations.train if split == "train" else conversations.val
    rows = sorted({round(i * (len(chosen) - 1) / max(count - 1, 1)) for i in range(count)})
    prompts = []
    for row in rows:
        messages = chosen[row]
        first_reply = next(i for i, m in enumerate(messages) if m.role == "assistant")
        prompts.append(messages[:first_reply])
    return prompts


def reply_is_good(finish: Finish, end_id: int) -> bool | None:
    """True for a reply that ends with ``end_id`` and does not loop; False for one that loops; None
    for neither (it ran on without looping, or ended on another end token)."""
    if repeats_ngram(finish.text):
        return False
    if finish.token_ids and finish.token_ids[-1] == end_id:
        return True
    return None


def build_preference_set(run: LoadedRun, prompts: list[list[Message]], settings: SetSettings) -> PreferenceSet:
    """Sample ``settings.samples`` replies to each prompt with ``run`` and pair a good one with a bad one."""
    special = ChatTokenIds.of(run.tokenizer)
    fitted: list[tuple[list[Message], list[int]]] = []
    for messages in prompts:
        try:
            fitted.append((messages, fit_for_reply(run.tokenizer, messages, run.block_size).chat.ids))
        except ChatTooLong:
            continue  # a speech longer than the window: nothing to reply to
    prompt_ids = [ids for _, ids in fitted for _ in range(settings.samples)]
    finishes = sample_replies(run, prompt_ids, settings)
    return pair_replies([messages for messages, _ in fitted], finishes, settings.samples, special.end)


def sample_replies(run: LoadedRun, prompt_ids: list[list[int]], settings: SetSettings) -> list[Finish]:
    """A reply to each prompt through the engine, reply i seeded ``settings.seed + i``, as a chat
    samples it: role tokens suppressed, ended by ``<|end|>`` or ``<|endoftext|>`` (kept in the
    token ids, never in the text)."""
    special = ChatTokenIds.of(run.tokenizer)
    finishes: list[Finish] = []
    for start in range(0, len(prompt_ids), ROWS_PER_DECODE):
        sampling = SamplingSettings(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                    top_p=settings.top_p, seed=settings.seed + start,
                                    suppress_ids=special.suppress_ids)
        with eval_mode(run.model):
            # token_bytes: the engine then gives each reply's text, as a chat shows it.
            finishes += decode(run.model, prompt_ids[start:start + ROWS_PER_DECODE], sampling,
                               token_bytes=run.token_bytes, end_ids=special.reply_end_ids, slide=False)
    return finishes


def pair_replies(prompts: list[list[Message]], finishes: list[Finish], samples: int, end_id: int) -> PreferenceSet:
    """One pair per prompt with a good and a looping reply among its ``samples`` (``finishes`` holds
    each prompt's replies in turn): the looping reply cut where its first repeat completes, against
    the good reply nearest it in words (the earliest of equals)."""
    result = PreferenceSet([], len(prompts), len(finishes), 0, 0, 0)
    for i, messages in enumerate(prompts):
        replies = finishes[i * samples:(i + 1) * samples]
        verdicts = [reply_is_good(finish, end_id) for finish in replies]
        result.good += sum(v is True for v in verdicts)
        result.looped += sum(v is False for v in verdicts)
        result.ran_on += sum(f.reason == "length" for f in replies)
        good = [f.text for f, v in zip(replies, verdicts) if v is True]
        loops = [looping_prefix(f.text) for f, v in zip(replies, verdicts) if v is False]
        if good and loops:
            rejected = loops[0]
            chosen = min(good, key=lambda text: abs(len(text.split()) - len(rejected.split())))
            result.pairs.append(PreferencePair(tuple(messages), (Message("assistant", chosen),),
                                               (Message("assistant", rejected),)))
    return result


def write_preference_set(path: Path, pairs: list[PreferencePair]) -> None:
    """The pairs as JSON lines, written whole or not at all."""
    atomic_write_text(path, "".join(json.dumps(pair.to_row(), ensure_ascii=False) + "\n" for pair in pairs))


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="-m training.preference_set", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = SetSettings()
    parser.add_argument("--run", type=path_arg, required=True, help="a chat run (data.format: chat)")
    parser.add_argument("--out", type=path_arg, required=True, help="the .jsonl file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --out when it exists")
    parser.add_argument("--split", choices=("train", "val"), default="train",
                        help="the plays whose user turns are the prompts (default: train)")
    parser.add_argument("--prompts", type=int, default=defaults.prompts)
    parser.add_argument("--samples", type=int, default=defaults.samples)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--temperature", type=float, default=defaults.temperature)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    return parser


def _command(args: argparse.Namespace) -> int:
    for name in ("prompts", "samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.samples < 2:
        raise UserError("--samples must be at least 2: a pair needs a good and a bad reply to one prompt")
    if not 0 < args.temperature <= 10:
        raise UserError(f"--temperature must be in (0, 10], got {args.temperature}: the replies must differ")
    if args.out.suffix != ".jsonl":
        raise UserError(f"--out {args.out} must end in .jsonl (data.files reads the format from the name)")
    if args.out.exists() and not args.overwrite:
        raise UserError(f"{args.out} exists; pass --overwrite to replace it, or choose another --out")
    run = load_run(args.run, torch.device("cpu"))
    settings = SetSettings(prompts=args.prompts, samples=args.samples, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, seed=args.seed)
    built = build_preference_set(run, first_exchange_prompts(args.split, args.prompts), settings)
    if not built.pairs:
        raise UserError(f"no prompt of {built.prompts} got both a good and a looping reply from {args.run}; "
                        "raise --samples or --max-new-tokens, or use another run")
    write_preference_set(args.out, built.pairs)
    print(f"{built.prompts} prompts, {built.replies} replies: {built.good} ended with <|end|> without a repeated "
          f"4-gram, {built.looped} repeated a 4-gram, {built.ran_on} ran on past {args.max_new_tokens} tokens")
    print(f"wrote {len(built.pairs)} pairs to {args.out}: chosen replies {built.mean_words('chosen'):.1f} words "
          f"on average, rejected (cut after their first repeat) {built.mean_words('rejected'):.1f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(_parser(), argv, _command)


if __name__ == "__main__":
    raise SystemExit(main())
