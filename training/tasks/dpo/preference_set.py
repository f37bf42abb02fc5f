"""The built-in preference set: a chat run's own looping replies, against the same replies turned
another way where the loop begins (docs/training.md, "The built-in pairs", says how and why).

    python -m training.tasks.dpo.preference_set --run runs/tiny-chat --out runs/tiny-chat-preferences.jsonl

A looping greedy reply (it repeats a 4-gram of words, ``data.repetition``) is rejected, cut where its
first repeat completes (``looping_prefix``); the chosen one is the same reply up to where that repeat
begins (``before_repeat``), then the sampled continuation that ends with ``<|end|>``, repeats no
4-gram, and is nearest the rejected one in words. A reply that runs to the budget without looping is
never rejected: such a pair would only teach "shorter". Rows are TRL conversational rows that
``data.format: preference`` reads.

``--out`` is checked before any reply is made and written whole or not at all; a full disk is one
line, and Ctrl-C or SIGTERM stop at once with nothing written, exiting 130 or 143."""

import argparse
import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from common.cli import ArgumentParser, path_arg, run_stoppable
from common.errors import UserError, describe_os_error, with_path
from common.files import atomic_write_text
from common.threads import add_threads_argument, parse_threads, use_threads
from data.chat import ChatTokenIds, ChatTooLong, Message, encode_plain, fit_for_reply
from data.config import DataConfig
from data.repetition import before_repeat, looping_prefix, repeats_ngram
from data.sources.conversations import load_conversations
from inference.engine import Event, Finish, decode
from inference.sampling import SamplingSettings
from model.gpt import eval_mode
from rundir.loading import LoadedRun, load_run
from training.tasks.chat import held_out_rows
from training.tasks.dpo.pairs import PreferencePair

ROWS_PER_DECODE = 256  # replies decoded together: one engine, one cache of this many rows
# Continuations per looping prompt: the set pairs one of them, the nearest the loop in words, so a few
# dozen already find a good one where there is any; more is a typo that would hold every one in memory.
MAX_SAMPLES = 256


@dataclass(frozen=True)
class SetSettings:
    prompts: int = 6000  # user turns spread evenly over the split (those too long for the window are left out)
    samples: int = 8  # continuations sampled per prompt whose greedy reply loops
    max_new_tokens: int = 64  # a budget well past a chat run's usual reply, so a reply that reaches it runs on
    temperature: float = 0.8  # generate.py --chat's: the replies users see
    top_p: float | None = 0.95
    seed: int = 0


@dataclass
class PreferenceSet:
    pairs: list[PreferencePair]
    prompts: int  # prompts replied to
    replies: int
    looped: int  # prompts whose greedy reply repeated a 4-gram: those sampled further
    continuations: int  # continuations sampled from where those loops begin
    good: int  # continuations that ended within the budget and left their reply with no repeated 4-gram
    ran_on: int  # continuations that reached the budget without ending

    def mean_words(self, side: str) -> float:
        """The mean length in words of the pairs' ``side`` ("chosen" or "rejected") replies."""
        texts = [getattr(pair, side)[0].content for pair in self.pairs]
        return sum(len(text.split()) for text in texts) / max(len(texts), 1)


def first_exchange_prompts(split: str, count: int) -> list[list[Message]]:
    """The messages before the first reply of ``count`` conversations spread evenly over ``split``
    of the Shakespeare chat set (split as ``configs/tiny-chat.yaml`` splits it)."""
    conversations = load_conversations(DataConfig(source="shakespeare", format="chat"))
    chosen = conversations.train if split == "train" else conversations.val
    prompts = []
    for row in held_out_rows(chosen, count):  # every conversation once at most
        messages = chosen[row]
        first_reply = next(i for i, m in enumerate(messages) if m.role == "assistant")
        prompts.append(messages[:first_reply])
    return prompts


def continuation_is_good(start: str, finish: Finish, end_id: int) -> bool:
    """Whether ``finish``, continuing a reply that begins ``start``, ends it with ``end_id`` and
    leaves it without a repeated 4-gram."""
    return bool(finish.token_ids) and finish.token_ids[-1] == end_id and not repeats_ngram(start + finish.text)


def build_preference_set(run: LoadedRun, prompts: list[list[Message]], settings: SetSettings, *,
                         progress: bool = False) -> PreferenceSet:
    """Reply greedily to each prompt with ``run``; where that reply loops, sample
    ``settings.samples`` continuations from where the loop begins, and pair a good one against it."""
    special = ChatTokenIds.of(run.tokenizer)
    fitted: list[tuple[list[Message], list[int]]] = []
    for messages in prompts:
        try:
            fitted.append((messages, fit_for_reply(run.tokenizer, messages, run.block_size).chat.ids))
        except ChatTooLong:
            continue  # a speech longer than the window: nothing to reply to
    with _bar(len(fitted), "greedy replies", progress) as bar:
        greedy = sample_replies(run, [ids for _, ids in fitted], replace(settings, temperature=0.0, top_p=None), bar)
    looping = [i for i, finish in enumerate(greedy) if repeats_ngram(finish.text)]
    starts = [before_repeat(greedy[i].text) for i in looping]
    # Each continuation is sampled after its reply's start, as the chat format renders that text.
    start_ids = encode_plain(run.tokenizer, starts) if starts else []
    resumed = [fitted[i][1] + ids for i, ids in zip(looping, start_ids) for _ in range(settings.samples)]
    with _bar(len(resumed), "continuations of the loops", progress) as bar:
        continuations = sample_replies(run, resumed, settings, bar) if resumed else []
    built = pair_replies([fitted[i][0] for i in looping], [greedy[i] for i in looping], continuations,
                         settings.samples, special.end)
    built.prompts, built.replies = len(fitted), len(fitted) + len(continuations)
    return built


def _bar(total: int, what: str, enabled: bool) -> tqdm:
    return tqdm(total=total, desc=what, unit=" replies", disable=not enabled, dynamic_ncols=True)


def sample_replies(run: LoadedRun, prompt_ids: list[list[int]], settings: SetSettings,
                   bar: tqdm | None = None) -> list[Finish]:
    """A reply to each prompt through the engine as a chat samples it, reply i seeded
    ``settings.seed + i``; ``bar`` counts the finished replies."""
    special = ChatTokenIds.of(run.tokenizer)
    finishes: list[Finish] = []

    def count(row: int, event: Event) -> None:
        if event.finish is not None and bar is not None:
            bar.update(1)

    for start in range(0, len(prompt_ids), ROWS_PER_DECODE):
        sampling = SamplingSettings(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                    top_p=settings.top_p, seed=settings.seed + start,
                                    suppress_ids=special.suppress_ids)
        with eval_mode(run.model):
            # token_bytes: the engine then gives each reply's text, as a chat shows it.
            finishes += decode(run.model, prompt_ids[start:start + ROWS_PER_DECODE], sampling,
                               token_bytes=run.token_bytes, end_ids=special.reply_end_ids, slide=False, on_event=count)
    return finishes


def pair_replies(prompts: list[list[Message]], loops: list[Finish], continuations: list[Finish], samples: int,
                 end_id: int) -> PreferenceSet:
    """One pair per looping reply (``loops``) with a good continuation among its ``samples``
    (``continuations`` holds each prompt's in turn): the cut loop against its start and the good
    continuation nearest it in words (the earliest of equals)."""
    result = PreferenceSet([], len(prompts), len(loops) + len(continuations), len(loops), len(continuations), 0, 0)
    for i, (messages, loop) in enumerate(zip(prompts, loops)):
        start, rejected = before_repeat(loop.text), looping_prefix(loop.text)
        assert start is not None and rejected is not None, "pair_replies pairs replies that loop"
        mine = continuations[i * samples:(i + 1) * samples]
        good = [start + f.text for f in mine if continuation_is_good(start, f, end_id)]
        result.good += len(good)
        result.ran_on += sum(f.reason == "length" for f in mine)
        if good:
            chosen = min(good, key=lambda text: abs(len(text.split()) - len(rejected.split())))
            result.pairs.append(PreferencePair(tuple(messages), (Message("assistant", chosen),),
                                               (Message("assistant", rejected),)))
    return result


def write_preference_set(path: Path, pairs: list[PreferencePair]) -> None:
    """The pairs as JSON lines, written whole or not at all; a failure names ``path``."""
    try:
        atomic_write_text(path, "".join(json.dumps(pair.to_row(), ensure_ascii=False) + "\n" for pair in pairs))
    except OSError as e:  # a failed write or sync names no file
        raise with_path(e, path) from None


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="-m training.tasks.dpo.preference_set", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = SetSettings()
    parser.add_argument("--run", type=path_arg, required=True, help="a chat run (data.format: chat)")
    parser.add_argument("--out", type=path_arg, required=True, help="the .jsonl file to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --out when it exists")
    parser.add_argument("--split", choices=("train", "val"), default="train",
                        help="the plays whose user turns are the prompts (default: train)")
    parser.add_argument("--prompts", type=int, default=defaults.prompts,
                        help="user turns to reply to, spread evenly over the split; those longer than the run's "
                             f"window are left out (default: {defaults.prompts})")
    parser.add_argument("--samples", type=int, default=defaults.samples,
                        help="continuations sampled, from where the loop begins, per prompt whose greedy reply loops "
                             f"(default: {defaults.samples})")
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens,
                        help=f"the longest reply, in tokens (default: {defaults.max_new_tokens})")
    parser.add_argument("--temperature", type=float, default=defaults.temperature,
                        help=f"the continuations' sampling temperature (default: {defaults.temperature}, as "
                             "generate.py --chat)")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help=f"continuation i is sampled from seed + i (default: {defaults.seed})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_threads_argument(parser)
    return parser


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an --out that cannot be written: a file in the way of its folder, a
    folder where the file goes, or a folder this process cannot write in (read-only, no permission)."""
    if out.suffix != ".jsonl":
        raise UserError(f"--out {out} must end in .jsonl (data.files reads the format from the name)")
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; name the .jsonl file to write")
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it, or choose another --out")
    folder = out.absolute().parent
    while not folder.exists():  # the folders still to make: what matters is the first that exists
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"--out {out}: {folder} is a file, not a folder; choose another --out")
    try:  # the one sure test of a folder's writability: write in it (the probe leaves nothing behind)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f"--out {out}: {describe_os_error(e, folder)}") from None


def _command(args: argparse.Namespace) -> int:
    for name in ("prompts", "samples", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.samples > MAX_SAMPLES:
        raise UserError(f"--samples must be at most {MAX_SAMPLES}, got {args.samples:,}: the set keeps one "
                        "continuation of each loop, and every one sampled is held in memory")
    if not 0 < args.temperature <= 10:
        raise UserError(f"--temperature must be in (0, 10], got {args.temperature}: the replies must differ")
    check_out(args.out, args.overwrite)
    use_threads(parse_threads(args.threads))  # two threads on a core shared with others crawl
    run = load_run(args.run, torch.device("cpu"))
    settings = SetSettings(prompts=args.prompts, samples=args.samples, max_new_tokens=args.max_new_tokens,
                           temperature=args.temperature, seed=args.seed)
    built = build_preference_set(run, first_exchange_prompts(args.split, args.prompts), settings,
                                 progress=not args.no_progress)
    if not built.pairs:
        raise UserError(f"no prompt of {built.prompts} gave a looping greedy reply with a good continuation from {args.run}; "
                        "raise --prompts, --samples or --max-new-tokens, or use another run")
    write_preference_set(args.out, built.pairs)
    print(f"{built.prompts} prompts replied to greedily, {built.looped} of those replies looped; of the "
          f"{built.continuations} continuations sampled from where the loops begin, {built.good} ended with <|end|> "
          f"without a repeated 4-gram, {built.ran_on} ran on past {args.max_new_tokens} tokens")
    print(f"wrote {len(built.pairs)} pairs to {args.out}: chosen replies {built.mean_words('chosen'):.1f} words "
          f"on average, rejected (cut after their first repeat) {built.mean_words('rejected'):.1f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_stoppable(_parser(), argv, _command)


if __name__ == "__main__":
    raise SystemExit(main())
