"""generate.py's settings: the sampling settings plus how many samples, whether cached, compiled
or speculative (flags serve.py shares); the command line's edge, checked here once."""

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from common.cli import path_arg
from common.errors import UserError
from inference.sampling import MAX_SEED, SamplingSettings, check_sampling_args, rolls_past_window
from rundir.loading import LoadedRun, load_run

if TYPE_CHECKING:
    from model.config import GPTConfig
    from model.gpt import GPT

# Samples decode as one batch through one cache; beyond this the cache alone outgrows a laptop.
MAX_NUM_SAMPLES = 1024
# The most tool calls in one chat reply; after them the model must answer.
DEFAULT_MAX_CALLS = 4

PROPOSERS = ("lookup", "draft")
# A lookup guess costs a wider pass and nothing else, so it may run long; a draft's costs a draft
# step each, and the chance that all are accepted falls with every one.
DEFAULT_K = {"lookup": 8, "draft": 4}
MAX_K = 16


@dataclass(frozen=True)
class Speculation:
    """How to speculate: the proposer (``lookup`` or ``draft``), at most ``k`` guesses a step, and
    for ``draft`` the draft run's model (on the target's device, with its vocabulary). Checked at
    the edge (``checked_speculation``)."""

    proposer: str
    k: int
    draft: "GPT | None" = None


@dataclass(frozen=True)
class GenerationSettings(SamplingSettings):
    """``SamplingSettings`` and row i of ``num_samples`` seeded ``seed + i``."""

    num_samples: int = 1
    use_cache: bool = True
    compile: bool = False  # decode through inference.compiled_step (the command line chose it)
    sinks: int | None = None  # the first tokens a rolling window keeps; None: the window's default (checked_sinks)
    speculation: Speculation | None = None  # speculative decode steps (see checked_speculation)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise UserError(f"max_new_tokens must be >= 0 (got {self.max_new_tokens})")
        try:
            check_sampling_args(self.temperature, self.top_k, self.top_p, self.repetition_penalty)
        except ValueError as e:
            raise UserError(str(e)) from None
        if not 1 <= self.num_samples <= MAX_NUM_SAMPLES:
            raise UserError(
                f"num_samples must be >= 1 and at most {MAX_NUM_SAMPLES} (got {self.num_samples}): all samples "
                f"share one batch and its KV cache; run the command several times for more"
            )
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED - self.num_samples:
            raise UserError(f"seed must be between 0 and 2**63 - 1 - num_samples (got {self.seed})")
        if any(not s for s in self.stop):
            raise UserError("a stop string must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def checked_sinks(flag: int | None, config: "GPTConfig") -> int | None:
    """``--sinks`` (``flag``, None: the window's default) for a run of ``config``, refused where it
    cannot apply."""
    if flag is None:
        return None
    if not rolls_past_window(config.positions):
        raise UserError("--sinks applies to runs with rotary or no positions, which roll past the window; "
                        "this run has learned positions and re-encodes instead: drop --sinks")
    if not 0 <= flag < config.block_size:
        raise UserError(f"--sinks must be 0 to {config.block_size - 1} (the window less one), got {flag}")
    return flag


def add_speculation_arguments(parser: argparse.ArgumentParser) -> None:
    """``--speculate``, ``--draft-run`` and ``--speculate-k``, as generate.py and serve.py take them."""
    parser.add_argument("--speculate", choices=PROPOSERS, default=None,
                        help="speculative decoding: each step checks up to K guessed tokens in one pass, from "
                        "n-grams of the prompt and reply (lookup) or a smaller run (draft, with --draft-run). "
                        "Greedy output is unchanged; sampling keeps its distribution but not its seed's tokens. "
                        "Default: off")
    parser.add_argument("--draft-run", type=path_arg, default=None, metavar="DIR",
                        help="with --speculate draft: the smaller run that guesses, trained with this run's tokenizer")
    parser.add_argument("--speculate-k", type=int, default=None, metavar="K",
                        help="the most tokens guessed a step, 1 to %d (default: %s)" % (
                            MAX_K, ", ".join(f"{k} for {name}" for name, k in DEFAULT_K.items())))


def checked_speculation(args: argparse.Namespace, run: LoadedRun, *, use_cache: bool = True) -> Speculation | None:
    """The speculation ``args`` ask for with ``run`` (loading the draft run onto its device), or
    None; refuses, in one line, flags that do not go together and a draft with another tokenizer."""
    if args.speculate is None:
        given = (("--draft-run", args.draft_run, "draft"), ("--speculate-k", args.speculate_k, "lookup"))
        for flag, value, proposer in given:
            if value is not None:
                raise UserError(f"{flag} goes with --speculate; add --speculate {proposer}")
        return None
    if not use_cache:
        raise UserError("--speculate checks its guesses through the KV cache; drop --no-cache or --speculate")
    if (args.draft_run is not None) != (args.speculate == "draft"):
        raise UserError("--speculate draft needs --draft-run DIR, and --draft-run needs --speculate draft")
    k = DEFAULT_K[args.speculate] if args.speculate_k is None else args.speculate_k
    if not 1 <= k <= min(MAX_K, run.block_size - 1):
        raise UserError(f"--speculate-k must be 1 to {min(MAX_K, run.block_size - 1)}, got {k}")
    if args.speculate == "lookup":
        return Speculation("lookup", k)
    draft_dir = Path(args.draft_run)
    if not draft_dir.is_dir():
        raise UserError(f"--draft-run {draft_dir} is not a run directory; pass a run written by train.py")
    try:
        draft = load_run(draft_dir, run.device)
    except UserError as error:
        raise UserError(f"--draft-run: {error}") from None
    if draft.token_bytes != run.token_bytes or draft.model.config.vocab_size != run.model.config.vocab_size:
        raise UserError(f"--draft-run {draft_dir} has another tokenizer or vocabulary than {run.directory}; "
                        "a draft must guess this run's own token ids: pick a run trained with its tokenizer")
    return Speculation("draft", k, draft.model)
