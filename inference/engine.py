"""The engine: the one place a token is scheduled and sampled, for every caller.

generate.py, the chat REPL, training's samples and the server all decode here. A command line
steps it on its own thread (``decode``, or ``submit`` then ``run_until_idle``); the server runs
``start()``'s background loop. It owns the model and a ``KVCache`` of ``max_batch`` rows, each
filled to its own length. Each iteration (``step``):

1. drop requests whose caller went away, freeing their rows;
2. admit waiting requests into free rows;
3. encode (prefill) one chunk of each newly admitted prompt into its own row;
4. run one batched decode step for every decoding row, each at its own position (speculating, a
   row with guesses checks them in one wider pass instead: ``_speculate``);
5. sample the next token of every row with fresh logits, stream its text, and free the row the
   moment its request ends (length, an end token, a stop string).

Rows are independent: a request gets exactly the tokens it would get served alone, so
``--num-samples`` row i equals the run seeded seed + i (each request samples from its own
``seeded_generator``). The batched step computes each row bit for bit as alone under
``inference.batch_invariant``, which the server needs; a command line may turn it off for speed
and then agrees up to fp32 rounding. Prompts are encoded in chunks of ``prefill_chunk`` tokens on a
fixed grid from position 0, so a chunk depends only on its request: that is what lets the prefix
cache (``inference.prefix_cache``) copy in whole chunks without changing a token. Past the window
a row slides as ``inference.sampling.Window`` says; a prompt longer than a rolling window rolls
through the cache as feeding it one token at a time would have. A rolled row neither stores nor
looks up prefix pages. ``use_cache=False`` re-encodes each row's whole window for every token: the
reference the cache is tested against (a rolled window's own reference is in
tests/inference/test_rolling_cache.py).

With ``logprobs`` a request gets the chosen token's log-probability and the most likely tokens',
from the model's distribution before temperature, top-p and suppressed ids; with ``echo`` also its
prompt's, from the prefill's own pass (which then takes no pages from the prefix cache).

Results go back through a callback, called on the stepping thread with one ``Event`` per token and
a last one carrying the ``Finish``. A callback that raises ends its request (its row is freed) and
nobody else's: on a caller's thread the exception goes on to the caller, so a command line whose
reader left ends at once; on the server's loop it is logged, and the callback gets one last event
with the reason "error", so that whoever waits on it stops waiting."""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from inference.sampling import SamplingSettings, Window, new_seed, sample_next_token, seeded_generator
from inference.streaming import TextStream
from model.gpt import GPT

if TYPE_CHECKING:  # the optional steps are imported where they are asked for, so plain decoding loads none
    from inference.aot_step import AotStep
    from inference.compiled_step import CompiledStep
    from inference.prefix_cache import PrefixCache
    from inference.settings import Speculation
    from inference.speculative import Proposal, Speculator

log = logging.getLogger(__name__)

# Tokens a prompt is encoded in per iteration, and so the prefix cache's page: small enough that
# a prompt sharing most of its tokens with a cached one skips most of its work, large enough that
# a chunk's matrix products stay efficient.
DEFAULT_PREFILL_CHUNK = 32
MAX_TOP_LOGPROBS = 20  # the most alternatives OpenAI reports (its chat endpoint; its completions: 5)


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the model, and the most likely tokens there, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Finish:
    reason: str  # "length", "stop" (a stop string or an end token), "cancelled" or "error"
    prompt_tokens: int
    token_ids: tuple[int, ...]  # every token generated, an end token or stop-string token included
    text: str  # the whole text, ending before a stop string; end tokens are not shown
    cached_tokens: int = 0  # prompt tokens copied from the prefix cache rather than computed
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token of token_ids, when asked for
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()  # with echo: one per prompt token, the first None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class Event:
    text: str  # new text (whole characters), possibly empty
    token_id: int | None = None  # the token generated; None on a last event that only flushes text
    finish: Finish | None = None  # set on the request's last event
    logprob: TokenLogprob | None = None  # token_id's, when the request asked for logprobs


EventCallback = Callable[[Event], None]


class EngineBusy(Exception):
    """The waiting queue is full; the caller should try again later."""


class Ticket:
    """A submitted request; ``cancel()`` ends it (from any thread) and frees its row."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self._engine._cancel_pending = True
        self._engine._wake_up()


@dataclass(eq=False)
class _Request:
    ticket: Ticket
    prompt_ids: list[int]
    settings: SamplingSettings
    end_ids: frozenset[int]
    logprobs: int | None  # how many alternatives to report per token; None: no logprobs
    echo: bool  # report the prompt's logprobs too
    slide: bool  # past the window, slide (re-encode or roll, ``Window``); otherwise end there ("length")
    on_event: EventCallback
    stream: TextStream
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)  # prompt + generated: the window reads it
    start: int = 0  # the model's window (``Window``) begins at tokens[start]
    evicted: int = 0  # tokens a rolling window has dropped after its sinks
    row: int = -1
    prefilling: bool = True  # the row's window still has to be encoded into its cache row
    logits: torch.Tensor | None = None  # (1, vocab) next-token logits, once the row has them
    cached_tokens: int = 0
    token_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # with echo: filled chunk by chunk
    failed: bool = False  # its callback raised: the request has ended and gets no more events

    @functools.cached_property
    def token_options(self) -> tuple:
        """Rows with equal options sample together; the key is made once, not per token."""
        return tuple(self.settings.token_options().items())

    @property
    def generated(self) -> int:
        return len(self.tokens) - len(self.prompt_ids)


class Engine:
    """Continuous batching over ``model`` (in eval mode) for up to ``max_batch`` requests at once.

    ``max_queue`` requests may wait for a row (default 4 x max_batch); beyond that ``submit``
    raises EngineBusy. ``prefix_cache_bytes`` 0: no prefix cache. ``keep_fraction``, ``sinks``,
    ``roll``: the slide (``Window.for_positions``). ``token_bytes`` None: events carry no text.
    ``compile``: decode steps run compiled (``inference.aot_step.decode_step``), made here, once;
    prompts stay eager. ``speculation``: decode steps check proposed tokens
    (``inference.speculative``); rows with no proposal take the plain step."""

    def __init__(
        self,
        model: GPT,
        token_bytes: Sequence[bytes] | None = None,
        *,
        max_batch: int = 16,
        max_queue: int | None = None,
        prefill_chunk: int | None = None,
        prefix_cache_bytes: int = 0,
        use_cache: bool = True,
        keep_fraction: float | None = None,
        sinks: int | None = None,
        roll: bool = True,
        batch_invariant: bool = True,
        compile: bool = False,
        speculation: Speculation | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        cfg = model.config
        # Batch invariance is chosen here, once: see inference.batch_invariant.
        self.model = model
        if batch_invariant:
            from inference.batch_invariant import row_blocked
            self.model = row_blocked(model)
        self.token_bytes = token_bytes if token_bytes is not None else [b""] * cfg.vocab_size
        self.max_batch = max_batch
        self.max_queue = 4 * max_batch if max_queue is None else max_queue
        self.prefill_chunk = min(DEFAULT_PREFILL_CHUNK if prefill_chunk is None else prefill_chunk, cfg.block_size)
        if self.max_queue < 0 or self.prefill_chunk < 1 or prefix_cache_bytes < 0:
            raise ValueError("max_queue must be >= 0, prefill_chunk >= 1 and prefix_cache_bytes >= 0")
        self.block_size = cfg.block_size
        self.window = Window.for_positions(cfg.positions, cfg.block_size, keep_fraction, sinks, roll=roll)
        self.use_cache = use_cache
        assert not ((compile or speculation) and not use_cache), "compiled and speculative steps are cached ones"
        # A batch-invariant pass reads whole buffers, a speculative one checks a token and its proposals.
        whole_buffers = (1 + (speculation.k if speculation else 0)) if batch_invariant else 0
        self.speculator: Speculator | None = None
        if speculation:
            from inference.speculative import Speculator
            self.speculator = Speculator(speculation, max_batch, batch_invariant)
        if compile:
            from inference.aot_step import decode_step
            from inference.compiled_step import spare_slot_cache
            self.cache = spare_slot_cache(model, max_batch, whole_buffers=whole_buffers)
            # Off the server, a CPU step reads only the slots rows have filled (see CompiledStep).
            exact_window = not batch_invariant and self.cache.device.type == "cpu"
            self.compiled: AotStep | CompiledStep | None = decode_step(self.model, self.cache, exact_window=exact_window)
        else:
            self.cache = model.init_cache(max_batch, whole_buffers=whole_buffers)
            self.compiled = None
        self.prefix_cache: PrefixCache | None = None
        if prefix_cache_bytes:
            from inference.prefix_cache import PrefixCache
            self.prefix_cache = PrefixCache(self.prefill_chunk, prefix_cache_bytes)
        self.prefill_tokens = 0  # prompt tokens the model has encoded (not copied from the prefix cache)
        self._waiting: collections.deque[_Request] = collections.deque()
        self._rows: list[_Request | None] = [None] * max_batch
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._cancel_pending = False  # a ticket was cancelled since the last look: a step skips the scan otherwise

    # ---------------------------------------------------------------- the caller's side

    def submit(
        self,
        prompt_ids: Sequence[int],
        settings: SamplingSettings,
        on_event: EventCallback,
        end_ids: Sequence[int] = (),
        *,
        logprobs: int | None = None,
        echo: bool = False,
        slide: bool = True,
    ) -> Ticket:
        """Queue a request (thread-safe); it ends early at any token in ``end_ids``. ``logprobs``:
        how many alternatives to report per token; ``echo``: the prompt's logprobs too. ``slide``
        False: the reply ends where the window is full (a learned run's chat: a re-encoded cut inside
        a turn is a conversation no template renders). Where the window does not roll, the prompt
        must fit it. The caller has checked the settings."""
        prompt_ids = list(prompt_ids)
        assert prompt_ids and (self.window.rolls or len(prompt_ids) <= self.block_size), \
            f"a prompt must have 1 to {self.block_size} tokens where the window does not roll"
        assert settings.max_new_tokens >= 1
        assert logprobs is None or 0 <= logprobs <= MAX_TOP_LOGPROBS
        ticket = Ticket(self)
        request = _Request(
            ticket, prompt_ids, settings, frozenset(end_ids), logprobs, echo, slide, on_event,
            TextStream(self.token_bytes, settings.stop),
            # Seeded as generate.py seeds its first sample: the same draws anywhere.
            seeded_generator(settings.seed if settings.seed is not None else new_seed()),
            tokens=list(prompt_ids),
        )
        with self._wake:
            # Requests the loop has not admitted yet may still have free rows waiting for them.
            free_rows = self.max_batch - self.active
            if len(self._waiting) - free_rows >= self.max_queue:
                raise EngineBusy(f"{len(self._waiting)} requests are already waiting")
            self._waiting.append(request)
            self._wake.notify()
        return ticket

    @property
    def active(self) -> int:
        return sum(request is not None for request in self._rows)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @torch.inference_mode()  # entered once, not per step
    def run_until_idle(self) -> None:
        """Step on the calling thread until every submitted request has finished (after Ctrl-C,
        ``cancel_all`` ends the requests in flight)."""
        while self._waiting or self.active:
            self._step()

    def cancel_all(self) -> None:
        """End every request as cancelled and free its row, on the calling thread."""
        with self._wake:
            requests = [*self._waiting, *filter(None, self._rows)]
            self._waiting.clear()
        for request in requests:
            self._finish(request, "cancelled")

    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """End the loop; requests still in flight are finished as cancelled."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.cancel_all()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wake_up(self) -> None:
        with self._wake:
            self._wake.notify()

    # ---------------------------------------------------------------- the loop

    @torch.inference_mode()
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._waiting and self.active == 0:
                    self._wake.wait()
                if self._stopping:
                    return
            try:
                self._step()
            except Exception:  # a bug: fail the requests in flight, keep serving the next ones
                log.exception("engine iteration failed; ending the requests in flight")
                for request in filter(None, self._rows):
                    self._finish(request, "error")

    @torch.inference_mode()
    def step(self) -> None:
        """One iteration (see the module's docstring)."""
        self._step()

    def _step(self) -> None:
        self._drop_cancelled()
        self._admit()
        for request in filter(None, self._rows):
            if request.prefilling:
                self._prefill_chunk(request)
        decoding = [r for r in self._rows if r is not None and not r.prefilling and r.logits is None]
        if decoding and self.speculator is not None:
            decoding = self._speculate(decoding)
        if decoding:
            self._decode(decoding)
        ready = [r for r in self._rows if r is not None and r.logits is not None]
        if ready:
            self._sample(ready)

    def _drop_cancelled(self) -> None:
        if not self._cancel_pending:
            return
        self._cancel_pending = False  # before the scan: a cancel that lands during it is seen next step
        with self._wake:
            gone = [r for r in self._waiting if r.ticket.cancelled]
            for request in gone:
                self._waiting.remove(request)
        for request in gone + [r for r in self._rows if r is not None and r.ticket.cancelled]:
            self._finish(request, "cancelled")

    def _admit(self) -> None:
        if not self._waiting:  # a request submitted meanwhile is admitted at the next step
            return
        with self._wake:
            for row, occupant in enumerate(self._rows):
                if occupant is None and self._waiting:
                    request = self._waiting.popleft()
                    request.row = row
                    self._rows[row] = request
                    self.cache.reset([row])

    def _prefill_chunk(self, request: _Request) -> None:
        """Encode the next chunk of the row's window (after copying in the cached pages it begins
        with); the last chunk yields next-token logits. Whole chunks go to the prefix cache.
        Without the KV cache the whole window is one chunk, encoded afresh for every token."""
        row, size = request.row, self.prefill_chunk
        echo = request.echo and len(request.prompt_logprobs) < len(request.prompt_ids)
        assert not (self.use_cache and request.evicted and request.generated), "a rolled row is never encoded again"
        if self.use_cache and self.cache.lengths[row] == 0 and self.prefix_cache is not None and not echo:
            self._copy_cached_pages(request)
        self._roll_prompt(request)  # after the pages: they may fill the window
        window = self.window.tokens(request.tokens, request.start, request.evicted)
        if self.use_cache:
            done = self.cache.lengths[row]
            chunk = window[done:min(done + size, self.block_size)]
            fed = request.start + request.evicted + done  # the stream index of the chunk's first token
            logits = self._run_model([chunk], [row], echo)
            if self.prefix_cache is not None and len(chunk) == size and not request.evicted:
                self.prefix_cache.store(window[:done + size], self.cache.read(row, done, done + size))
        else:
            assert not (echo and request.evicted), "a prompt's logprobs past the window need the cache"
            chunk, fed = window, 0
            logits = self._run_model([chunk], None, echo)
        self.prefill_tokens += len(chunk)
        if echo:
            self._add_prompt_logprobs(request, logits[0], fed)
            logits = logits[:, -1]
        if not self.use_cache or self.cache.lengths[row] == len(window):
            request.logits = logits
            request.prefilling = not self.use_cache  # uncached: the whole window again for the next token

    def _copy_cached_pages(self, request: _Request) -> None:
        """Copy the prefix cache's pages the row's window begins with into its empty cache row."""
        if request.evicted:
            return
        window = self.window.tokens(request.tokens, request.start, request.evicted)
        for page in self.prefix_cache.lookup(window):
            self.cache.extend(request.row, page)
        if request.generated == 0:
            request.cached_tokens = self.cache.lengths[request.row]

    def _roll_prompt(self, request: _Request) -> None:
        """Before the next chunk of a prompt longer than a rolling window: roll where feeding the
        prompt one token at a time would have, so that the cache ends as that would leave it."""
        if not self.window.rolls:
            return
        if self.use_cache:
            if self.cache.lengths[request.row] == self.block_size:
                self._slide(request, request.start + request.evicted + self.block_size + 1)
            return
        while self.window.held(request.start, request.evicted, len(request.tokens)) > self.block_size:
            self._slide(request, request.start + request.evicted + self.block_size + 1)

    @staticmethod
    def _add_prompt_logprobs(request: _Request, logits: torch.Tensor, first: int) -> None:
        """Record the logprobs of the prompt tokens that one chunk's ``logits`` (T, vocab), at
        prompt positions ``first`` onwards, predict. The first token has none."""
        if not request.prompt_logprobs:
            request.prompt_logprobs.append(None)
        targets = request.prompt_ids[first + 1:first + 1 + len(logits)]
        logprobs = torch.log_softmax(logits[:len(targets)].float(), dim=-1)
        request.prompt_logprobs += _token_logprobs(logprobs, targets, request.logprobs or 0)

    def _decode(self, requests: list[_Request]) -> None:
        """One token for every decoding row, in one batched forward pass."""
        if self.compiled is not None:
            logits = self.compiled({r.row: r.tokens[-1] for r in requests})
            for request in requests:
                request.logits = logits[request.row:request.row + 1]
            return
        logits = self._run_model([[r.tokens[-1]] for r in requests], [r.row for r in requests])
        for i, request in enumerate(requests):
            request.logits = logits[i:i + 1]

    def _speculate(self, requests: list[_Request]) -> list[_Request]:
        """Each row the proposer has guesses for checks them (one pass for the rows with as many
        guesses), keeps the cache entries of the accepted ones (``KVCache.rewind``) and advances by
        every token emitted; returns the rows left to the plain step. Guesses stop where a row's
        window is full and where its request runs out of tokens, so a window slides only at a
        step's last token and ``_advance`` ends a request at the token plain decoding would."""
        room = [min(self.block_size - self.window.held(r.start, r.evicted, len(r.tokens)),
                    r.settings.max_new_tokens - r.generated - 1) for r in requests]
        proposals = self.speculator.propose(requests, room)
        widths: dict[int, list[tuple[_Request, Proposal]]] = collections.defaultdict(list)
        for request, proposal in zip(requests, proposals):
            if proposal.tokens:
                widths[len(proposal.tokens)].append((request, proposal))
        for group in widths.values():
            logits = self._run_model([[r.tokens[-1], *p.tokens] for r, p in group], [r.row for r, _ in group],
                                     every_position=True)
            checked = []
            for (request, proposal), row_logits in zip(group, logits):
                tokens = self.speculator.check(request, proposal, row_logits)
                # The pass wrote the newest token and every guess: keep it and the accepted guesses.
                accepted = len(tokens) - 1
                self.cache.rewind(request.row, self.cache.lengths[request.row] - len(proposal.tokens) + accepted)
                checked.append((request, tokens, row_logits))
            for request, tokens, row_logits in checked:
                for token, token_logits in zip(tokens, row_logits):
                    if request.logprobs is not None:
                        logprobs = torch.log_softmax(token_logits[None].float(), dim=-1)
                        request.token_logprobs += _token_logprobs(logprobs, [token], request.logprobs)
                    self._advance(request, token)
                    if self._rows[request.row] is not request:  # it ended at this token
                        break
        return [r for r, p in zip(requests, proposals) if not p.tokens]

    def _run_model(self, ids: list[list[int]], rows: list[int] | None, every_position: bool = False) -> torch.Tensor:
        """The one call into the model: next-token logits (R, vocab) of ``ids`` appended to cache
        ``rows`` (None: no cache), or with ``every_position`` the logits (R, T, vocab)."""
        idx = torch.tensor(ids, device=self.cache.device)
        cache = self.cache if rows is not None else None
        if every_position:
            return self.model(idx, cache=cache, rows=rows)
        return self.model.next_token_logits(idx, cache, rows)

    def _sample(self, requests: list[_Request]) -> None:
        # Rows with the same settings sample in one call, each from its own generator; the
        # sampler works row by row, so that equals sampling each alone.
        groups: dict[tuple, list[_Request]] = collections.defaultdict(list)
        for request in requests:
            groups[request.token_options].append(request)
        for options, group in groups.items():
            logits = group[0].logits if len(group) == 1 else torch.cat([r.logits for r in group])
            tokens = self._sample_group(logits, dict(options), group)
            for i, (request, token) in enumerate(zip(group, tokens)):
                request.logits = None
                if request.logprobs is not None:
                    logprobs = torch.log_softmax(logits[i:i + 1].float(), dim=-1)
                    request.token_logprobs += _token_logprobs(logprobs, [token], request.logprobs)
                self._advance(request, token)

    @staticmethod
    def _sample_group(logits: torch.Tensor, options: dict, group: list[_Request]) -> list[int]:
        if options["repetition_penalty"] == 1.0:
            return sample_next_token(logits, **options, generator=[r.generator for r in group]).tolist()
        # The penalty reads each row's own history (prompt and reply), of its own length.
        return [int(sample_next_token(logits[i:i + 1], **options, generator=r.generator,
                                      prev_tokens=torch.tensor([r.tokens], device=logits.device)))
                for i, r in enumerate(group)]

    def _advance(self, request: _Request, token: int) -> None:
        """Record a sampled token, stream it, and decide what the row does next."""
        request.tokens.append(token)
        if token in request.end_ids:
            self._finish(request, "stop", token)
            return
        text = request.stream.push(token)
        if request.stream.stopped:
            self._finish(request, "stop", token, text)
        elif request.generated == request.settings.max_new_tokens or (not request.slide and self.window.held(
                request.start, request.evicted, len(request.tokens)) == self.block_size):
            self._finish(request, "length", token, text)
        else:
            self._slide(request)
            self._emit(request, Event(text, token, logprob=self._last_logprob(request)))

    def _slide(self, request: _Request, length: int | None = None) -> None:
        """Move the row's window on if its newest token (``tokens[length - 1]``) overflows it."""
        length = len(request.tokens) if length is None else length
        start, evicted = self.window.slide(request.start, request.evicted, length)
        if self.use_cache and start != request.start:
            # Learned positions cannot slide: the kept tokens are re-encoded from position 0.
            request.prefilling = True
            self.cache.reset([request.row])
        elif self.use_cache and evicted != request.evicted:
            # Rotary or none: the middle leaves the cache, the recent entries move down beside the sinks.
            self.cache.drop(request.row, self.window.sinks, evicted - request.evicted, self.model.move_entries)
        request.start, request.evicted = start, evicted

    def _finish(self, request: _Request, reason: str, token: int | None = None, text: str = "") -> None:
        """Free the request's row and send its last event."""
        self._free_row(request)
        if reason in ("length", "stop"):
            text += request.stream.finish()  # an unfinished character at the end, as U+FFFD
        logprob = self._last_logprob(request) if token is not None else None
        self._emit(request, Event(text, token, self._finish_of(request, reason), logprob))

    def _free_row(self, request: _Request) -> None:
        if request.row >= 0 and self._rows[request.row] is request:
            self._rows[request.row] = None
            self.cache.reset([request.row])

    @staticmethod
    def _finish_of(request: _Request, reason: str) -> Finish:
        generated = tuple(request.tokens[len(request.prompt_ids):])
        return Finish(reason, len(request.prompt_ids), generated, request.stream.text, request.cached_tokens,
                      tuple(request.token_logprobs), tuple(request.prompt_logprobs))

    @staticmethod
    def _last_logprob(request: _Request) -> TokenLogprob | None:
        return request.token_logprobs[-1] if request.token_logprobs else None

    def _emit(self, request: _Request, event: Event) -> None:
        """Hand ``event`` to the request's callback; one that raises ends the request (see the
        module's docstring)."""
        if request.failed:
            return
        try:
            request.on_event(event)
        except Exception:
            request.failed = True
            self._free_row(request)
            if threading.current_thread() is not self._thread:
                raise  # the caller steps the engine itself: the error is the caller's to handle
            log.exception("an engine event callback raised; its request ends with an error")
            if event.finish is None:
                try:
                    request.on_event(Event("", finish=self._finish_of(request, "error")))
                except Exception:
                    log.exception("the callback raised again, at its request's last event")


def decode(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    settings: SamplingSettings,
    *,
    token_bytes: Sequence[bytes] | None = None,
    end_ids: Sequence[int] = (),
    use_cache: bool = True,
    keep_fraction: float | None = None,
    sinks: int | None = None,
    roll: bool = True,
    slide: bool = True,
    batch_invariant: bool = False,
    compile: bool = False,
    speculation: Speculation | None = None,
    on_event: Callable[[int, Event], None] | None = None,
    on_compiled: Callable[[AotStep | CompiledStep], None] | None = None,
) -> list[Finish]:
    """Decode every prompt on the calling thread, prompt i sampled from ``settings.seed + i`` (a
    fresh seed when None), each in a row of one engine; returns their ``Finish``es in order.
    A prompt is cut to its last block_size tokens where the window does not roll.
    ``on_event(i, event)`` streams prompt i's events; ``on_compiled(step)`` is given the compiled
    step (its ``compile_seconds``, ``built`` and ``notice``) before the first token; the rest as in
    ``Engine`` and ``Engine.submit``."""
    assert prompts, "decode needs at least one prompt"
    cfg = model.config
    rolls = Window.for_positions(cfg.positions, cfg.block_size, keep_fraction, sinks, roll=roll).rolls
    prompts = [list(p) if rolls else list(p)[-cfg.block_size:] for p in prompts]
    if settings.max_new_tokens == 0:
        return [Finish("length", len(p), (), "") for p in prompts]
    # The server's arithmetic includes its prefill grid; otherwise a prompt is encoded in one pass.
    chunk = None if batch_invariant else cfg.block_size
    engine = Engine(model, token_bytes, max_batch=len(prompts), max_queue=0, prefill_chunk=chunk,
                    use_cache=use_cache, keep_fraction=keep_fraction, sinks=sinks, roll=roll,
                    batch_invariant=batch_invariant, compile=compile, speculation=speculation)
    if engine.compiled is not None and on_compiled is not None:
        on_compiled(engine.compiled)
    seed = settings.seed if settings.seed is not None else new_seed()
    finishes: list[Finish | None] = [None] * len(prompts)

    def collect(i: int) -> EventCallback:
        def on(event: Event) -> None:
            if event.finish is not None:
                finishes[i] = event.finish
            if on_event is not None:
                on_event(i, event)
        return on

    for i, prompt in enumerate(prompts):
        sample_settings = replace(settings, seed=seed + i)
        engine.submit(prompt, sample_settings, collect(i), end_ids, slide=slide)
    try:
        engine.run_until_idle()
    finally:
        engine.cancel_all()  # after Ctrl-C: nothing is left half-done for a caller to see
    return finishes


def _token_logprobs(logprobs: torch.Tensor, token_ids: Sequence[int], top: int) -> list[TokenLogprob]:
    """``TokenLogprob`` of ``token_ids[i]`` under row i of ``logprobs``, with its ``top`` best."""
    index = torch.tensor(token_ids, dtype=torch.long, device=logprobs.device).unsqueeze(1)
    chosen = logprobs.gather(1, index)[:, 0].tolist()
    values, ids = logprobs.topk(top, dim=-1) if top else (logprobs[:, :0], logprobs[:, :0].long())
    return [TokenLogprob(token, value, tuple(zip(row_ids, row_values)))
            for token, value, row_ids, row_values in zip(token_ids, chosen, ids.tolist(), values.tolist())]
