"""Speculative decoding against plain decoding: greedy, batch 1, on the CPU, side by side in one run.

    python -m benchmarks.speculative                         # runs/tiny
    python -m benchmarks.speculative --run runs/tiny --draft-run runs/tiny-small --json

Two kinds of text. Input-grounded: the prompt holds a passage of a play that the default split
(tiny.yaml's) holds out of training, then the passage's opening again, as written or with one word
changed (a reply that quotes its prompt, an edit of a given passage), so the continuation can copy.
Free: a speaker's name, and whatever the model writes after it. Each prompt is decoded plainly and
with each proposer (prompt lookup; a draft run with --draft-run), round-robin over --repeats rounds;
a figure is the best round's, as in benchmarks/generate_speed.py.

Rates count from the first token; the greedy tokens must be plain decoding's. Speculation loses where
guesses are rejected: every checking pass is wider than a plain step, and a draft spends a draft step
on each guess, so free text, which repeats little of its prompt, gains little from lookup and may lose
with a draft; the command says so wherever the ratio is below 1.

The proposals need a model that has learnt to copy: random weights have not, runs/tiny hardly has,
and runs/tiny-quote (configs/tiny-quote.yaml: runs/tiny after a minute on passages written twice) has."""

import argparse
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.shared import benchmark_parser, print_rows
from common.cli import path_arg, positive_int, run_command
from common.errors import UserError
from common.threads import thread_count
from data.config import DataConfig
from data.sources.shakespeare import held_out_plays, shakespeare_documents
from inference.engine import Engine, Event
from inference.sampling import SamplingSettings
from inference.settings import DEFAULT_K, Speculation, checked_speculation
from rundir.loading import LoadedRun, load_run

DEFAULT_RUN = Path("runs/tiny")
SPEAKERS = ("ROMEO:\n", "KING LEAR:\n", "HAMLET:\n", "First Citizen:\n")


@dataclass
class Result:
    kind: str
    proposer: str
    k: int
    plain_tokens_per_s: float
    speculative_tokens_per_s: float
    accepted_per_step: float
    tokens_per_pass: float
    identical: bool

    @property
    def ratio(self) -> float:
        return self.speculative_tokens_per_s / self.plain_tokens_per_s


def build_parser() -> argparse.ArgumentParser:
    parser = benchmark_parser("speculative", __doc__)
    parser.add_argument("--run", type=path_arg, default=None, help=f"the run to decode with (default: {DEFAULT_RUN})")
    parser.add_argument("--draft-run", type=path_arg, default=None, metavar="DIR",
                        help="also speculate with this smaller run as the draft, same tokenizer (default: none, lookup only)")
    defaults = ", ".join(f"{k} for {proposer}" for proposer, k in DEFAULT_K.items())
    parser.add_argument("--k", type=positive_int, default=None, help=f"guesses a step (default: {defaults})")
    parser.add_argument("--new-tokens", type=positive_int, default=40, help="tokens per prompt (default 40)")
    parser.add_argument("--prompts", type=positive_int, default=4, help="prompts of each kind (default 4)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="best of this many rounds (default 3)")
    parser.add_argument("--threads", type=thread_count, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON object per kind and proposer")
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser(), argv, measure)


def measure(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    run = load_run(args.run or _default_run(), torch.device("cpu"))
    if not 2 <= args.new_tokens < run.block_size // 2:
        raise UserError(f"--new-tokens must be 2 to {run.block_size // 2 - 1} (under half the run's context, "
                        f"so that a prompt's passage fits beside it), got {args.new_tokens}")
    speculations = {}
    for proposer in ("lookup", "draft") if args.draft_run else ("lookup",):
        flags = argparse.Namespace(speculate=proposer, draft_run=args.draft_run if proposer == "draft" else None,
                                   speculate_k=args.k)
        speculations[proposer] = checked_speculation(flags, run)
    kinds = {"input-grounded": grounded_prompts(run, args.new_tokens, args.prompts),
             "free": [run.tokenizer.encode(SPEAKERS[i % len(SPEAKERS)]).ids for i in range(args.prompts)]}
    results = [compare(run, kind, prompts, speculation, args)
               for kind, prompts in kinds.items() for speculation in speculations.values()]
    if not args.json:
        print(f"run {run.directory}: block_size {run.block_size}, {run.model.num_params() / 1e6:.2f}M parameters; "
              f"greedy, batch 1, {args.new_tokens} tokens a prompt, {args.prompts} prompts a kind, "
              f"{torch.get_num_threads()} thread{'s' * (torch.get_num_threads() != 1)}, best of {args.repeats}")
    print_rows(("text", "proposer", "k", "plain tokens/s", "speculative tokens/s", "ratio", "accepted/step",
                "tokens/pass", "identical"),
               (({**asdict(r), "ratio": r.ratio},
                 (r.kind, r.proposer, r.k, f"{r.plain_tokens_per_s:.1f}", f"{r.speculative_tokens_per_s:.1f}",
                  f"{r.ratio:.2f}x", f"{r.accepted_per_step:.2f}", f"{r.tokens_per_pass:.2f}", r.identical))
                for r in results), args.json, left=2)
    if args.json:
        return 0
    for r in results:
        if r.ratio < 1:
            draft = " and the draft's own steps" if r.proposer == "draft" else ""
            print(f"speculation loses on {r.kind} text with {r.proposer}: {r.accepted_per_step:.2f} guesses accepted "
                  f"a step do not pay for the wider checking passes{draft}")
    if not all(r.identical for r in results):
        print("error: speculative greedy tokens differ from plain decoding's")
        return 1
    return 0


def _default_run() -> Path:
    if not (DEFAULT_RUN / "model.safetensors").is_file():
        raise UserError(f"no run at {DEFAULT_RUN}: train one (python train.py --config configs/tiny.yaml) "
                        "or pass --run DIR")
    return DEFAULT_RUN


def grounded_prompts(run: LoadedRun, new_tokens: int, count: int) -> list[list[int]]:
    """The input-grounded prompts (a blank line between passage and opening), each sized so that it
    and ``new_tokens`` fit the run's context."""
    split = DataConfig()
    held_out = held_out_plays(split.val_fraction, split.split_seed)
    ids, texts = shakespeare_documents()
    plays = [text for play, text in zip(ids, texts) if play in held_out]
    budget = run.block_size - new_tokens - 4
    prompts = []
    for i in range(count):
        text = plays[i % len(plays)]
        start = text.index("\n", len(text) // 3 + 997 * i) + 1  # from the middle of the play, on a line's start
        passage = run.tokenizer.encode(text[start:start + 8 * run.block_size]).ids[:budget * 4 // 5]
        opening = passage[:len(passage) // 5]
        if i % 2:  # an edit: the opening's longest word in capitals
            words = run.tokenizer.decode(opening).split(" ")
            longest = max(range(len(words)), key=lambda j: len(words[j]))
            words[longest] = words[longest].upper()
            opening = run.tokenizer.encode(" ".join(words)).ids
        prompts.append(passage + run.tokenizer.encode("\n\n").ids + opening)
    return prompts


def compare(run: LoadedRun, kind: str, prompts: list[list[int]], speculation: Speculation,
            args: argparse.Namespace) -> Result:
    best = {None: [float("inf")] * len(prompts), speculation: [float("inf")] * len(prompts)}
    tokens, counts = {}, {}
    for _ in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for path in best:
                ids, seconds, counts[path, i] = decode_once(run, prompt, args.new_tokens, path)
                best[path][i] = min(best[path][i], seconds)
                tokens[path, i] = ids
    generated = sum(len(tokens[None, i]) - 1 for i in range(len(prompts)))
    steps, _, accepted = (sum(counts[speculation, i][j] for i in range(len(prompts))) for j in range(3))
    return Result(kind, speculation.proposer, speculation.k,
                  plain_tokens_per_s=generated / sum(best[None]),
                  speculative_tokens_per_s=generated / sum(best[speculation]),
                  accepted_per_step=accepted / max(steps, 1), tokens_per_pass=1 + accepted / max(steps, 1),
                  identical=all(tokens[None, i] == tokens[speculation, i] for i in range(len(prompts))))


def decode_once(run: LoadedRun, prompt: list[int], new_tokens: int,
                speculation: Speculation | None) -> tuple[tuple[int, ...], float, list[int]]:
    """Greedy tokens, seconds from the first token to the last, and the speculator's counts
    (steps, guesses proposed, accepted) of one generation, as generate.py decodes one prompt."""
    engine = Engine(run.model, run.token_bytes, max_batch=1, max_queue=0, prefill_chunk=run.block_size,
                    batch_invariant=False, speculation=speculation)
    stamps: list[float] = []
    finish: list = []

    def on_event(event: Event) -> None:
        if event.token_id is not None:
            stamps.append(time.perf_counter())
        if event.finish is not None:
            finish.append(event.finish)

    engine.submit(prompt, SamplingSettings(max_new_tokens=new_tokens, temperature=0.0), on_event)
    engine.run_until_idle()
    counts = [0, 0, 0] if engine.speculator is None else [
        engine.speculator.steps, engine.speculator.proposed, engine.speculator.accepted]
    return finish[0].token_ids, stamps[-1] - stamps[0], counts


if __name__ == "__main__":
    raise SystemExit(main())
