"""Replies that call tools: decode until a call, run the tool, append its result, continue.

``decode_with_tools`` is the one multi-turn decode for every caller that runs tools itself (the chat
REPL, ``generate.py --chat --tools``, RL rollouts). It steps the engine and never samples itself.
Each round, every unfinished row submits its prompt so far and the engine runs them all; each
segment is read back (``data.chat.parse_reply``): calls are run by the ``Toolbox``, each result
appended as a ``tool`` turn and a bare ``<|assistant|>``, and the row goes on; a segment without calls
is the answer; malformed calls end the reply as it is ("malformed").

A row goes on from the ids the model generated, not a re-rendering of its text (a model may spell a
text in other tokens), so ``ids`` are exactly what was sampled, interleaved with what was inserted,
and ``generated`` marks the tokens a loss may count. The prefix cache finds each continuation's
prompt in the last one's pages.

Ctrl-C with ``stop_on_interrupt`` ends rows where they are ("cancelled"); a call cut short gets an
error result, so every call has its result. Past ``max_calls`` ``<|call|>`` is no longer sampled;
``max_new_tokens`` counts the reply's tokens over all segments; a prompt that would fill the window
ends the reply ("length"). Row i's first segment samples from ``seed + i``, later ones from seeds
derived from it alone (``segment_seed``), so each row gets what it would get decoded alone."""

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from tokenizers import Tokenizer

from data.chat import ChatTokenIds, Message, ToolCall, parse_reply, render_chat
from inference.engine import Engine, Event, Finish
from inference.sampling import MAX_SEED, SamplingSettings, new_seed
from inference.settings import DEFAULT_MAX_CALLS
from tools import Toolbox, ToolResult
from tools.toolbox import error_result


@dataclass(frozen=True)
class ToolStep:
    """One call the model made, and what the tool answered."""

    call: ToolCall
    result: ToolResult


@dataclass
class ToolReply:
    """One row's reply, with the calls it made and their results."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # after the prompt: every generated and inserted token
    generated: list[bool] = field(default_factory=list)  # per id: True where the model sampled it
    messages: list[Message] = field(default_factory=list)  # assistant (with calls), tool, ..., assistant
    steps: list[ToolStep] = field(default_factory=list)
    # "stop": the model ended its turn; "length": max_new_tokens or the window; "malformed": calls
    # that do not parse (``error`` says why); "cancelled": interrupted
    finish_reason: str = ""
    error: str | None = None

    @property
    def text(self) -> str:
        """The reply's last assistant text: the answer (for "malformed", its calls as written)."""
        return next((m.content for m in reversed(self.messages) if m.role == "assistant"), "")

    @property
    def generated_tokens(self) -> int:
        return sum(self.generated)


TextCallback = Callable[[int, str], None]  # (row, text of the reply, outside calls)
StepCallback = Callable[[int, ToolStep], None]  # (row, a call just run)


def decode_with_tools(
    engine: Engine,
    tokenizer: Tokenizer,
    prompts: Sequence[Sequence[int]],
    settings: SamplingSettings,
    toolbox: Toolbox | None,
    *,
    max_calls: int = DEFAULT_MAX_CALLS,
    slide: bool = False,
    stop_on_interrupt: bool = False,
    on_text: TextCallback | None = None,
    on_step: StepCallback | None = None,
) -> list[ToolReply]:
    """Each prompt's reply (a rendered conversation ending in ``<|assistant|>``), its calls run by
    ``toolbox`` (None: no tools). ``on_text(i, text)`` streams row i's text outside its calls,
    ``on_step(i, step)`` each call once run. Ctrl-C propagates unless ``stop_on_interrupt``."""
    assert prompts and max_calls >= 0
    assert len(prompts) <= engine.max_batch + engine.max_queue, "the engine must take every row at once"
    special = ChatTokenIds.of(tokenizer)
    if toolbox is not None:
        special.require_tools()
    seed = settings.seed if settings.seed is not None else new_seed()
    decoding = _Decoding(engine, tokenizer, special, settings, toolbox, slide, stop_on_interrupt, on_text, on_step)
    rows = [_Row(i, ToolReply(list(p)), list(p), seed + i, max_calls, max_calls) for i, p in enumerate(prompts)]
    going = rows
    while going:
        finishes, interrupted = decoding.run_segments(going)
        going = [row for row in going if decoding.take(row, finishes.get(row.index), interrupted)]
    return [row.reply for row in rows]


def segment_seed(seed: int, segment: int) -> int:
    """The seed of a row's segment after a tool result: a function of the row's seed alone, so no
    two rows (seeded ``seed + i``) share a stream."""
    return seed if segment == 0 else random.Random(f"{seed}/{segment}").randrange(MAX_SEED)


@dataclass
class _Row:
    index: int
    reply: ToolReply
    prompt: list[int]  # what the next segment continues
    seed: int
    max_calls: int
    calls_left: int
    segments: int = 0


@dataclass
class _Decoding:
    """What every round of one ``decode_with_tools`` call shares."""

    engine: Engine
    tokenizer: Tokenizer
    special: ChatTokenIds
    settings: SamplingSettings
    toolbox: Toolbox | None
    slide: bool
    stop_on_interrupt: bool
    on_text: TextCallback | None
    on_step: StepCallback | None

    def run_segments(self, rows: list[_Row]) -> tuple[dict[int, Finish], bool]:
        """Submit the next segment of every row, run the engine until all are done; their Finishes
        by row, and whether a Ctrl-C ended them (only with ``stop_on_interrupt``; else it propagates)."""
        finishes: dict[int, Finish] = {}
        for row in rows:
            tools = self.toolbox is not None and row.calls_left > 0
            suppress = {*self.settings.suppress_ids, *self.special.reply_suppress_ids(tools)}
            segment = replace(self.settings, seed=segment_seed(row.seed, row.segments),
                              suppress_ids=tuple(sorted(suppress)),
                              max_new_tokens=self.settings.max_new_tokens - row.reply.generated_tokens)
            self.engine.submit(row.prompt, segment, self._collector(row.index, finishes), self.special.reply_end_ids,
                               slide=self.slide)
        try:
            self.engine.run_until_idle()
        except KeyboardInterrupt:
            self.engine.cancel_all()  # every row in flight gets its "cancelled" Finish, with its text so far
            if not self.stop_on_interrupt:
                raise
            return finishes, True
        return finishes, False

    def _collector(self, i: int, finishes: dict[int, Finish]) -> Callable[[Event], None]:
        """Row i's engine callback: its text goes on until a call begins; its Finish is kept."""
        in_call = False

        def on_event(event: Event) -> None:
            nonlocal in_call
            in_call = in_call or (event.token_id is not None and event.token_id == self.special.call)
            if self.on_text is not None and event.text and not in_call:
                self.on_text(i, event.text)
            if event.finish is not None:
                finishes[i] = event.finish

        return on_event

    def take(self, row: _Row, finish: Finish | None, interrupted: bool) -> bool:
        """Take in a row's finished segment; whether the row goes on to another (its calls were run)."""
        reply = row.reply
        if finish is None:  # its callback raised (a reader gone, a Ctrl-C inside it): nothing more came
            reply.finish_reason = "cancelled"
            return False
        reply.ids += finish.token_ids
        reply.generated += [True] * len(finish.token_ids)
        row.segments += 1
        parsed = parse_reply(self.tokenizer, finish.token_ids, self.toolbox.names if self.toolbox else None)
        # Calls count only in a segment that ended its turn (not one cut short, stopped by a stop
        # string, or finished just before a Ctrl-C that ended the others).
        ended_turn = (finish.reason == "stop" and bool(finish.token_ids)
                      and finish.token_ids[-1] in self.special.reply_end_ids)
        if interrupted or not (ended_turn and self.toolbox is not None and (parsed.calls or parsed.error)):
            reply.messages.append(Message("assistant", parsed.text))
            reply.finish_reason = "cancelled" if interrupted else finish.reason
            return False
        if parsed.error is not None:
            reply.messages.append(Message("assistant", parsed.text))
            reply.finish_reason, reply.error = "malformed", parsed.error
            return False
        reply.messages.append(Message("assistant", parsed.content, parsed.calls))
        inserted = self._run_calls(row, parsed.calls)
        if inserted is None:
            reply.finish_reason = "cancelled"
            return False
        row.prompt = row.prompt + list(finish.token_ids) + inserted
        if len(row.prompt) >= self.engine.block_size or reply.generated_tokens >= self.settings.max_new_tokens:
            reply.finish_reason = "length"  # no room left to answer the results
            return False
        return True

    def _run_calls(self, row: _Row, calls: Sequence[ToolCall]) -> list[int] | None:
        """Run ``calls``, keep their steps, and return the ids inserted after them (each result's
        turn, then ``<|assistant|>``); None when a Ctrl-C cut them short, every call given a result."""
        reply, inserted, interrupted = row.reply, [], False
        for call in calls:
            if interrupted:
                result = error_result("interrupted (Ctrl-C)")
            elif row.calls_left > 0:
                row.calls_left -= 1
                try:
                    result = self.toolbox.run(call.name, call.arguments)
                except KeyboardInterrupt:  # the toolbox has stopped its worker
                    if not self.stop_on_interrupt:
                        raise
                    interrupted, result = True, error_result("interrupted (Ctrl-C)")
            else:
                result = error_result(f"no more calls in this reply (the limit is {row.max_calls})")
            step = ToolStep(call, result)
            reply.steps.append(step)
            reply.messages.append(Message("tool", result.text))
            inserted += render_chat(self.tokenizer, [Message("tool", result.text)]).ids
            if self.on_step is not None:
                self.on_step(row.index, step)
        if not interrupted:
            inserted.append(self.special.role["assistant"])
        reply.ids += inserted
        reply.generated += [False] * len(inserted)
        return None if interrupted else inserted
