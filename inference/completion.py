"""From a prompt to streamed continuations: encode, decode ``num_samples`` rows through
``inference.engine``, hand their text on as it arrives, and time the first token and the rest."""

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from data.tokenizer import prompt_ids
from inference.engine import Event, decode
from inference.sampling import new_seed, rolls_past_window
from inference.settings import GenerationSettings
from rundir.loading import LoadedRun

# Called with (row, new_text) whenever a row has text that is safe to print.
TextCallback = Callable[[int, str], None]


@dataclass(frozen=True)
class PromptTokens:
    ids: list[int]  # what the model is given: at most block_size tokens, unless the window rolls
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
    time_to_first_token_s: float | None  # prefill + first sample, from the call (or the compile) to the first token
    decode_time_s: float  # from the first token to the last
    compile_s: float | None = None  # compiling the decode step, when it was compiled
    compile_notice: str | None = None  # what the compiled step says of itself: built now, or loaded
    compile_built: bool = False  # built by this command (its compiler processes then shared the cores)

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
    """Token ids for ``prompt`` (empty: end-of-text); past the context, all of them where the
    window rolls, else the last block_size."""
    ids = prompt_ids(run.tokenizer, prompt)
    kept = ids if rolls_past_window(run.model.config.positions) else ids[-run.block_size:]
    return PromptTokens(kept, len(ids))


def generate_completions(
    run: LoadedRun, ids: Sequence[int], settings: GenerationSettings, on_text: TextCallback | None = None,
    *, batch_invariant: bool = False,
) -> GenerationResult:
    """Sample ``settings.num_samples`` continuations of ``ids`` together (``inference.engine.decode``:
    row i seeded ``seed + i``); every row's streamed pieces join to its ``Completion.text``.
    ``batch_invariant``: the server's arithmetic, bit for bit."""
    seed = settings.seed if settings.seed is not None else new_seed()
    rows = settings.num_samples
    # When decoding started, and when the first and the last token came.
    clock: dict[str, float] = {"start": time.perf_counter()}

    def on_event(row: int, event: Event) -> None:
        if event.token_id is not None:
            clock["last"] = time.perf_counter()
            clock.setdefault("first", clock["last"])
        if event.text and on_text is not None:
            on_text(row, event.text)

    compiled = []

    def on_compiled(step) -> None:
        compiled.append(step)
        clock["start"] = time.perf_counter()  # time to first token leaves the one-off compile out

    finishes = decode(run.model, [ids] * rows, replace(settings, seed=seed), token_bytes=run.token_bytes,
                      use_cache=settings.use_cache, sinks=settings.sinks, batch_invariant=batch_invariant,
                      compile=settings.compile, speculation=settings.speculation,
                      on_event=on_event, on_compiled=on_compiled)
    completions = [
        Completion(text=f.text, token_ids=list(f.token_ids), finish_reason=f.reason,
                   seed=None if settings.greedy else seed + row)
        for row, f in enumerate(finishes)
    ]
    steps = max(f.completion_tokens for f in finishes)
    first = clock.get("first")
    ttft, decode_time = (None, 0.0) if first is None else (first - clock["start"], clock["last"] - first)
    stats = GenerationStats(rows, steps, time_to_first_token_s=ttft, decode_time_s=decode_time,
                            **({"compile_s": compiled[0].compile_seconds, "compile_notice": compiled[0].notice,
                                "compile_built": compiled[0].built} if compiled else {}))
    return GenerationResult(completions, stats, seed)
