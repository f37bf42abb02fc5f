"""A conversation with a chat-tuned run, turn by turn, decoded by the engine on this thread.

The session keeps the conversation as messages. Each user turn is fitted to the window by the chat
format's one policy (``data.chat.fit_for_reply``; the session says what it dropped before the
reply), rendered, and decoded by ``inference.engine``, whose prefix cache keeps earlier turns' pages.
With learned positions a reply ends where the window is full rather than sliding it: a window cut
inside a turn would open on text with no role token, which no template renders. With rotary or no
positions the cache rolls (``inference.sampling.Window``), keeping the first and the most recent
tokens, so only a last message too long on its own rolls rather than being refused.
``use_cache=False`` recomputes the whole window for every token: the reference for the cached path.

With a ``Toolbox`` a reply is decoded by ``inference.tool_use`` and the conversation keeps its calls
and results; without one ``<|call|>`` is never sampled. Turn i samples from ``seed + i``."""

from dataclasses import dataclass, field, replace
from typing import Callable

from common.errors import DataError, UserError
from data.chat import ChatTokenIds, ChatTooLong, Message, fit_for_reply, render_chat
from inference.engine import Engine
from inference.sampling import new_seed
from inference.settings import DEFAULT_MAX_CALLS, GenerationSettings
from inference.tool_use import ToolStep, decode_with_tools
from rundir.loading import LoadedRun
from tools import Toolbox

# The finish reasons of a reply (inference.tool_use) as a chat reports them.
FINISH_REASONS = {"stop": "end", "length": "length", "cancelled": "interrupted", "malformed": "malformed call"}


@dataclass(frozen=True)
class ChatReply:
    text: str
    token_ids: list[int]  # the reply's ids, the closing <|end|> included when the model produced it
    # "end": the model ended its turn; "length": max_new_tokens or a full window; "interrupted": Ctrl-C;
    # "malformed call": a call that does not parse (``error`` says why), shown as written
    finish_reason: str
    steps: list[ToolStep] = field(default_factory=list)  # the calls made, with their results
    error: str | None = None


class ChatSession:
    """One conversation; ``reply`` adds a user turn and returns the model's answer."""

    def __init__(
        self, run: LoadedRun, settings: GenerationSettings, *, system_prompt: str | None = None,
        use_cache: bool = True, on_notice: Callable[[str], None] | None = None, toolbox: Toolbox | None = None,
        max_calls: int = DEFAULT_MAX_CALLS,
    ) -> None:
        self.run = run
        try:  # a run from before the chat format, or (with tools) before tool calls: one line
            self.special = ChatTokenIds.of(run.tokenizer)
            if toolbox is not None:
                self.special.require_tools()
        except DataError as error:
            raise UserError(str(error)) from None
        self.toolbox, self.max_calls = toolbox, max_calls
        self.settings = settings
        self.block_size = run.block_size
        self.system = [Message("system", system_prompt)] if system_prompt else []
        system_tokens = len(render_chat(run.tokenizer, self.system).ids)
        if system_tokens and system_tokens >= self.block_size // 2:
            raise UserError(
                f"the system prompt is {system_tokens} tokens, too much of the model's {self.block_size}-token "
                "window; shorten it"
            )
        self.seed = settings.seed if settings.seed is not None else new_seed()
        # Room in the prefix cache for two windows: the last prompt's pages and the next one's.
        window_bytes = run.model.init_cache(1).nbytes()
        self.engine = Engine(run.model, run.token_bytes, max_batch=1, max_queue=0, use_cache=use_cache,
                             prefix_cache_bytes=2 * window_bytes if use_cache else 0, batch_invariant=False,
                             sinks=settings.sinks, compile=settings.compile, speculation=settings.speculation)
        self.on_notice = on_notice or (lambda message: None)
        if self.engine.compiled is not None:
            self.on_notice(self.engine.compiled.notice)
        self.reset()

    @property
    def tokens_encoded(self) -> int:
        """Positions run through the model so far: shows how much of the history was reused."""
        return self.engine.prefill_tokens

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.messages: list[Message] = []
        self.turns = 0

    def reply(self, user_text: str, on_text: Callable[[str], None] | None = None,
              on_step: Callable[[ToolStep], None] | None = None) -> ChatReply:
        """Append the user's turn, generate the reply (text to ``on_text``, each call run to
        ``on_step``) and keep it; Ctrl-C stops it ("interrupted"), keeping what was said."""
        try:
            fitted = fit_for_reply(self.run.tokenizer, [*self.system, *self.messages, Message("user", user_text)],
                                   self.block_size, rolls=self.engine.window.rolls)
        except ChatTooLong as error:
            raise UserError(str(error)) from None
        if fitted.dropped:
            self.messages = self.messages[fitted.dropped:]
            self.on_notice(fitted.notice(self.block_size))
        settings = replace(self.settings, seed=self.seed + self.turns)
        # The chat rule (data.chat.ChatTokenIds): role tokens never sampled, end tokens never
        # shown; a learned run's reply ends where the window is full (see the module's docstring).
        [reply] = decode_with_tools(
            self.engine, self.run.tokenizer, [fitted.chat.ids], settings, self.toolbox, max_calls=self.max_calls,
            slide=self.engine.window.rolls, stop_on_interrupt=True,
            on_text=(lambda _row, text: on_text(text)) if on_text is not None else None,
            on_step=(lambda _row, step: on_step(step)) if on_step is not None else None)
        self.turns += 1
        self.messages += [Message("user", user_text), *reply.messages]
        return ChatReply(reply.text, reply.ids, FINISH_REASONS[reply.finish_reason], reply.steps, reply.error)
