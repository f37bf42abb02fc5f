"""What every route shares (the run, the engine, the limits, the chat token ids) and the steps a
route takes with them: read a body within its limit, turn a prompt or a chat into token ids that
fit the context, submit to the engine.

A chat that may call tools is steered by decoding, never by prompting: with ``tool_choice: none``
``<|call|>`` is never sampled; with ``required`` the reply is made to begin with ``<|call|>``, and
with a named function with ``<|call|>`` and the name's tokens, written into the prompt where the
model would have sampled them. The model writes the rest."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from starlette.requests import ClientDisconnect

from common.errors import DataError
from data.chat import NO_TOOL_TOKENS, ChatTokenIds, ChatTooLong, encode_plain, fit_for_reply, to_messages
from inference.completion import encode_prompt
from inference.engine import Engine, EngineBusy, Event, Ticket
from inference.sampling import SamplingSettings
from rundir.loading import LoadedRun
from serving.errors import ApiError
from serving.replies import ReplyCalls
from serving.schemas import Body, ChatCompletionRequest, RequestError, ServerRules, parse_request

# How long an overloaded server asks clients to wait before trying again (seconds).
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request's prompt ids (then any call tokens forced), how many old messages were
    dropped, and how its calls are read (None: no tools)."""

    ids: list[int]
    dropped: int
    special: ChatTokenIds
    calls: ReplyCalls | None

    @property
    def suppress_ids(self) -> tuple[int, ...]:
        """Role tokens are never sampled; nor ``<|call|>`` where the request may not call."""
        return self.special.reply_suppress_ids(tools=self.calls is not None)


@dataclass(frozen=True)
class Limits:
    max_tokens_cap: int = 2048  # the largest max_tokens a request may ask for
    default_max_tokens: int = 256  # when a request gives none (at most the cap)
    # A prompt fills the context long before this, even JSON-escaped; a bigger body only costs memory.
    max_body_bytes: int = 2**20
    discard_s: float = 30.0  # how long an over-size body's rest is read and dropped before the 413


class Service:
    """The run served, its engine and limits, and the chat token ids (None when it cannot chat)."""

    def __init__(self, run: LoadedRun, engine: Engine, limits: Limits, model_id: str) -> None:
        self.run, self.engine, self.limits, self.model_id = run, engine, limits, model_id
        self.rules = ServerRules(model_id, len(run.token_bytes), limits.max_tokens_cap, limits.default_max_tokens)
        self.created = int(time.time())
        try:
            self.chat_ids: ChatTokenIds | None = ChatTokenIds.of(run.tokenizer)
            self.no_chat_reason = ""
        except DataError as error:
            self.chat_ids, self.no_chat_reason = None, str(error)
        # A token stands for at most this many characters, so a longer text cannot fit the context:
        # refused before the tokenizer spends time on it.
        self.max_prompt_chars = run.block_size * max(len(b) for b in run.token_bytes)

    async def read(self, request: Request, schema: type[Body]) -> Body:
        """The request's body as ``schema``; refused with 413 past ``max_body_bytes``, keeping no
        more than that (whether or not the client declared a Content-Length)."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        over = declared.isdigit() and int(declared) > limit
        stream, raw, ended = request.stream(), bytearray(), True
        try:
            if not over:
                async for chunk in stream:
                    raw += chunk
                    if len(raw) > limit:
                        over = True
                        break
            if over:
                ended = await _drop_rest(stream, self.limits.discard_s)
        except ClientDisconnect:
            raise ApiError(499, "the client closed the connection") from None
        if over:
            raise ApiError(413, f"the request body is over this server's limit of {limit} bytes "
                           "(serve.py --max-body-bytes); send a shorter one", code="request_too_large",
                           headers=None if ended else {"Connection": "close"})
        try:
            return parse_request(bytes(raw), schema, self.rules)
        except RequestError as error:
            raise ApiError(error.status, str(error), param=error.param, code=error.code) from None

    def check_length(self, chars: int, tokens: int | None, param: str) -> None:
        """Refuse a prompt longer than the context, except where the window rolls: the engine reads
        any prompt through a rolling cache (the body limit bounds it)."""
        block = self.run.block_size
        if self.engine.window.rolls:
            return
        if chars > self.max_prompt_chars or (tokens is not None and tokens > block):
            size = f"{tokens} tokens" if tokens is not None else f"{chars} characters"
            raise ApiError(400, f"{param}: {size}, more than this model's context of {block} "
                           f"tokens; shorten it", param=param, code="context_length_exceeded")

    def completion_prompt(self, prompt: str | list[int]) -> tuple[list[int], str]:
        """A completion request's prompt (text, or token ids the schema has checked) as token ids,
        and as text (what echo returns)."""
        if isinstance(prompt, str):
            self.check_length(len(prompt), None, "prompt")
            encoded = encode_prompt(self.run, prompt)
            self.check_length(len(prompt), encoded.original_length, "prompt")
            return encoded.ids, prompt
        self.check_length(0, len(prompt), "prompt")
        return list(prompt), b"".join(self.run.token_bytes[i] for i in prompt).decode("utf-8", "replace")

    def chat_prompt(self, body: ChatCompletionRequest) -> ChatPrompt:
        """A chat request's messages rendered by the chat format and cut to leave room for the reply
        and the call tokens ``tool_choice`` forces."""
        if self.chat_ids is None:
            raise ApiError(400, f"this run cannot chat: {self.no_chat_reason}; /v1/completions "
                           "still works", param="messages", code="chat_not_supported")
        messages = body.messages
        if messages and messages[-1].content:
            self.check_length(len(messages[-1].content), None, "messages")
        special, tokenizer = self.chat_ids, self.run.tokenizer
        if body.may_call and not special.has_tools:
            raise ApiError(400, f"tools: {NO_TOOL_TOKENS}", param="tools", code="tools_not_supported")
        forced = _forced_call(special, tokenizer, body.choice)
        try:
            checked = to_messages([_message(m) for m in messages])
            fitted = fit_for_reply(tokenizer, checked, self.run.block_size - len(forced),
                                   rolls=self.engine.window.rolls)
        except ChatTooLong as error:
            raise ApiError(400, str(error), param="messages", code="context_length_exceeded") from None
        except DataError as error:
            raise ApiError(400, str(error), param="messages") from None
        calls = ReplyCalls(tokenizer, special, tuple(forced), body.tool_names, body.parallel_tool_calls) \
            if body.may_call else None
        return ChatPrompt(fitted.chat.ids + forced, fitted.dropped, special, calls)

    def submit(
        self, prompt_ids: list[int], params: SamplingSettings, end_ids: list[int], logprobs: int | None = None,
        echo: bool = False, slide: bool = True,
    ) -> tuple[Ticket, asyncio.Queue[Event]]:
        """Hand a request to the engine; its events arrive on the returned queue, on this loop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def on_event(event: Event) -> None:  # called on the engine thread
            with contextlib.suppress(RuntimeError):  # the event loop has closed: shutting down
                loop.call_soon_threadsafe(queue.put_nowait, event)

        try:
            ticket = self.engine.submit(prompt_ids, params, on_event, end_ids=end_ids, logprobs=logprobs, echo=echo,
                                        slide=slide)
        except EngineBusy:
            raise ApiError(503, "the server is busy: every row and the waiting queue are full; retry "
                           "shortly", kind="server_busy", code="overloaded",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        return ticket, queue


def _message(message) -> dict:
    """A request's message in the chat format's shape (``data.chat.to_messages``)."""
    calls = [{"function": {"name": call.function.name, "arguments": call.function.arguments}}
             for call in message.tool_calls or ()]
    return {"role": message.role, "content": message.content, "tool_calls": calls}


def _forced_call(special: ChatTokenIds, tokenizer, choice: str) -> list[int]:
    """The tokens a reply must begin with: ``<|call|>``, and a named function's name (the tokens
    the call's text has: the tokenizer never merges across the ``{`` that ends a name)."""
    if choice in ("none", "auto"):
        return []
    return [special.call, *(encode_plain(tokenizer, [choice])[0] if choice != "required" else [])]


async def _drop_rest(stream: AsyncIterator[bytes], seconds: float) -> bool:
    """Read what is left of a body and drop it, for at most ``seconds``; whether it ended. Most
    clients send a whole body before they read the answer: one that asked to close the connection
    would see it reset instead of the 413 if the server closed it with the body still coming."""
    try:
        async with asyncio.timeout(seconds):
            async for _ in stream:
                pass
        return True
    except TimeoutError:
        return False
