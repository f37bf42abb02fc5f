"""From a prompt to streamed continuations: encode, drive ``generate_tokens``, decode, time.

``model.generation.generate_tokens`` owns the decoding itself (cache, sampling, the window policy
past block_size); this module turns its token columns into per-row text as they arrive, applies
stop strings, and measures time to first token and decode speed.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from data.tokenizer import prompt_ids
from inference.settings import GenerationSettings
from inference.streaming import TextStream
from model.generation import generate_tokens, new_seed, seeded_generator
from rundir.loading import LoadedRun

# Called with (row, new_text) whenever a row has text that is safe to print.
TextCallback = Callable[[int, str], None]


@dataclass(frozen=True)
class PromptTokens:
    ids: list[int]  # what the model is given: at most block_size tokens
    original_length: int  # before cropping

    @property
    def cropped(self) -> bool:
        return len(self.ids) < self.original_length


@dataclass(frozen=True)
class Completion:
    text: str  # the continuation (without the prompt), ending before a stop string
    token_ids: list[int]  # generated tokens, up to and including the one that completed a stop string
    finish_reason: str  # "length": max_new_tokens reached; "stop": a stop string appeared
    seed: int | None  # the row's generator seed; None when decoding greedily


@dataclass(frozen=True)
class GenerationStats:
    rows: int
    steps: int  # decoding steps taken = tokens generated per row
    time_to_first_token_s: float | None  # prefill + first sample, from the call to the first token
    decode_time_s: float  # from the first token to the last

    @property
    def tokens_generated(self) -> int:
        return self.rows * self.steps

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens per second after the first one (all rows counted); None with fewer than two steps."""
        if self.steps < 2 or self.decode_time_s <= 0:
            return None
        return self.rows * (self.steps - 1) / self.decode_time_s


@dataclass(frozen=True)
class GenerationResult:
    completions: list[Completion]
    stats: GenerationStats
    seed: int  # the seed in effect (row i used seed + i when sampling)


def encode_prompt(run: LoadedRun, prompt: str) -> PromptTokens:
    """Token ids for ``prompt`` (``data.tokenizer.prompt_ids``: an empty prompt is end-of-text).
    Longer than the context: the last block_size tokens."""
    ids = prompt_ids(run.tokenizer, prompt)
    return PromptTokens(ids[-run.block_size :], len(ids))


def generate_completions(
    run: LoadedRun, ids: Sequence[int], settings: GenerationSettings,
    on_text: TextCallback | None = None, *, batch_invariant: bool = False,
) -> GenerationResult:
    """Sample ``settings.num_samples`` continuations of ``ids`` as one batch (one cache).

    Row i draws from its own generator seeded ``seed + i``, so it equals the single-row run with
    that seed. Every row's streamed pieces join to its ``Completion.text``. ``batch_invariant``:
    decode with the serving engine's arithmetic (see ``model.batch_invariant``).
    """
    seed = settings.seed if settings.seed is not None else new_seed()
    rows = settings.num_samples
    idx = torch.tensor([list(ids)] * rows, dtype=torch.long, device=run.device)
    generators = [seeded_generator(seed + row) for row in range(rows)]
    streams = [TextStream(run.token_bytes, settings.stop) for _ in range(rows)]
    start = time.perf_counter()
    columns = generate_tokens(
        run.model, idx, settings.max_new_tokens, **settings.token_options(), use_cache=settings.use_cache,
        generator=generators, batch_invariant=batch_invariant,
    )
    tokens, steps, first, last = _stream_columns(columns, streams, on_text)
    completions = [
        Completion(
            text=stream.text, token_ids=tokens[row], finish_reason="stop" if stream.stopped else "length",
            seed=None if settings.greedy else seed + row,
        )
        for row, stream in enumerate(streams)
    ]
    ttft, decode_time = (None, 0.0) if first is None else (first - start, last - first)
    stats = GenerationStats(rows, steps, time_to_first_token_s=ttft, decode_time_s=decode_time)
    return GenerationResult(completions, stats, seed)


def _stream_columns(
    columns: Iterator[torch.Tensor], streams: list[TextStream], on_text: TextCallback | None
) -> tuple[list[list[int]], int, float | None, float | None]:
    """Feed each row's tokens to its stream until every row stops or the columns run out.

    Returns (tokens per row, steps taken, time of the first column, time of the last).
    """
    tokens: list[list[int]] = [[] for _ in streams]

    def emit(row: int, text: str) -> None:
        if text and on_text is not None:
            on_text(row, text)

    steps, first, last = 0, None, None
    # closing(): leaving early (all rows stopped, Ctrl-C) frees the generator's KV cache and token
    # buffer at once rather than whenever the generator is garbage collected.
    with contextlib.closing(columns):
        for column in columns:
            column_ids = column.tolist()  # waits for the device, so the timings are honest
            last = time.perf_counter()
            first = first if first is not None else last
            steps += 1
            for row, token_id in enumerate(column_ids):
                if not streams[row].stopped:
                    tokens[row].append(token_id)
                    emit(row, streams[row].push(token_id))
            if all(stream.stopped for stream in streams):
                break
    for row, stream in enumerate(streams):
        emit(row, stream.finish())
    return tokens, steps, first, last
