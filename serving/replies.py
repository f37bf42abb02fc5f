"""The shape of each response kind, whole or as stream chunks: one class per endpoint. Nothing
here waits on the engine: that is ``serving.streaming``'s job.

A chat reply offered tools (``ReplyCalls``) is read back by the chat format (``data.chat.parse_reply``)
once it ends: calls that parse become OpenAI's ``tool_calls``; anything else, a malformed call
included, is the reply's text, as written. Streamed, the text goes out as it comes until a call
begins; the call is held until the reply ends and sent then, as tool-call deltas or, if it does not
parse, as text. The server never runs a tool: the client does."""

import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass

from tokenizers import Tokenizer

from data.chat import ChatTokenIds, ParsedReply, parse_reply
from inference.engine import Event, Finish
from serving.logprobs import ReplyLogprobs


class Reply(ABC):
    """What every response kind shares: the envelope, the usage, the headers, the token counts."""

    id_prefix: str  # "cmpl", "chatcmpl"
    kind: str  # the ``object`` of a whole body
    chunk_kind: str  # the ``object`` of a stream chunk

    def __init__(self, model_id: str, prompt_ids: list[int], logprobs: ReplyLogprobs,
                 headers: dict[str, str] | None = None) -> None:
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.model_id, self.created = model_id, int(time.time())
        self.prompt_ids, self.logprobs = prompt_ids, logprobs
        self.headers = headers or {}  # sent with the response, streamed or whole
        self.prompt_tokens, self.completion_tokens = len(prompt_ids), 0

    def envelope(self, kind: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_id, "choices": choices}

    def body(self, finish: Finish) -> dict:
        """The whole response, once generation has finished."""
        content, reason = self.ending(finish)
        choice = {"index": 0, **content, "logprobs": self.logprobs.whole(self.prompt_ids, finish),
                  "finish_reason": reason}
        return {**self.envelope(self.kind, [choice]), "usage": usage(finish)}

    def ending(self, finish: Finish) -> tuple[dict, str]:
        """The whole reply's content field, and its finish reason."""
        return self.content(finish.text), finish.reason

    def event_chunks(self, event: Event, logprobs: dict | None) -> list[dict]:
        """The stream chunks an engine event makes: its text, if it has any."""
        return [self.chunk(event.text, logprobs=logprobs)] if event.text or logprobs else []

    def closing_chunks(self, finish: Finish) -> list[dict]:
        """The chunks that end a stream."""
        return [self.chunk(None, finish.reason)]

    def usage_chunk(self, finish: Finish) -> dict:
        """The last chunk of a stream that asked for usage (``stream_options.include_usage``)."""
        return {**self.envelope(self.chunk_kind, []), "usage": usage(finish)}

    @abstractmethod
    def content(self, text: str) -> dict:
        """The whole reply's text, in this kind's field."""

    @abstractmethod
    def chunk(self, text: str | None, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        """A stream chunk: a piece of text, or (``text`` None) the end with ``finish_reason``."""

    @abstractmethod
    def opening(self) -> list[dict]:
        """The chunks a stream begins with, before any generated text."""


class CompletionReply(Reply):
    """``/v1/completions``: text, after the prompt itself when ``echo`` is given."""

    id_prefix, kind, chunk_kind = "cmpl", "text_completion", "text_completion"

    def __init__(self, model_id: str, prompt_ids: list[int], logprobs: ReplyLogprobs, *, echo: str = "") -> None:
        super().__init__(model_id, prompt_ids, logprobs)
        self.echo = echo  # the prompt text the reply begins with ("" without echo)

    def content(self, text: str) -> dict:
        return {"text": self.echo + text}

    def chunk(self, text: str | None, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return self.envelope(self.chunk_kind, [choice])

    def opening(self) -> list[dict]:
        return [self.chunk(self.echo)] if self.echo else []


@dataclass(frozen=True)
class ReplyCalls:
    """How a chat reply offered tools is read: the chat tokens, the call tokens forced at its start
    (``serving.service``), the functions offered, and ``parallel_tool_calls``."""

    tokenizer: Tokenizer
    special: ChatTokenIds
    forced: tuple[int, ...]
    names: tuple[str, ...]
    parallel: bool = True

    def read(self, finish: Finish) -> ParsedReply | None:
        """The reply's calls, when it ended its turn and every call parsed (one, unless several are
        allowed); None: it is text."""
        ended_turn = finish.reason == "stop" and bool(finish.token_ids) and \
            finish.token_ids[-1] in self.special.reply_end_ids
        if not ended_turn:
            return None
        parsed = parse_reply(self.tokenizer, [*self.forced, *finish.token_ids], self.names)
        if not parsed.calls_tools or (not self.parallel and len(parsed.calls) > 1):
            return None
        return parsed

    @property
    def forced_text(self) -> str:
        return self.tokenizer.decode(list(self.forced), skip_special_tokens=False)


class ChatReply(Reply):
    """``/v1/chat/completions``: the assistant's message (or its ``calls``), as deltas after a role chunk."""

    id_prefix, kind, chunk_kind = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def __init__(self, model_id: str, prompt_ids: list[int], logprobs: ReplyLogprobs,
                 headers: dict[str, str] | None = None, calls: ReplyCalls | None = None) -> None:
        super().__init__(model_id, prompt_ids, logprobs, headers)
        self.calls = calls
        # Streamed text held back since a call began (forced calls begin before the first token).
        self._held: list[str] | None = [] if calls is not None and calls.forced else None

    def content(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}}

    def ending(self, finish: Finish) -> tuple[dict, str]:
        if self.calls is None:
            return super().ending(finish)
        parsed = self.calls.read(finish)
        if parsed is None:
            return self.content(self.calls.forced_text + finish.text), finish.reason
        message = {"role": "assistant", "content": parsed.content or None, "tool_calls": [
            {"id": _call_id(), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in parsed.calls]}
        return {"message": message}, "tool_calls"

    def chunk(self, text: str | None, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        delta = {} if text is None else {"content": text}
        return self._delta_chunk(delta, finish_reason, logprobs)

    def event_chunks(self, event: Event, logprobs: dict | None) -> list[dict]:
        if self.calls is not None and self._held is None and event.token_id == self.calls.special.call:
            self._held = []
        if self._held is None:
            return super().event_chunks(event, logprobs)
        self._held.append(event.text)
        return []

    def closing_chunks(self, finish: Finish) -> list[dict]:
        if self._held is None:
            return super().closing_chunks(finish)
        parsed = self.calls.read(finish)
        if parsed is None:  # as text, as it was written
            return [self.chunk(self.calls.forced_text + "".join(self._held)), self.chunk(None, finish.reason)]
        chunks = []
        for index, call in enumerate(parsed.calls):
            opening = {"index": index, "id": _call_id(), "type": "function",
                       "function": {"name": call.name, "arguments": ""}}
            chunks += [self._delta_chunk({"tool_calls": [opening]}),
                       self._delta_chunk({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})]
        return [*chunks, self._delta_chunk({}, "tool_calls")]

    def opening(self) -> list[dict]:
        return [self._delta_chunk({"role": "assistant", "content": ""})]

    def _delta_chunk(self, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return self.envelope(self.chunk_kind, [choice])


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def usage(finish: Finish) -> dict:
    return {"prompt_tokens": finish.prompt_tokens, "completion_tokens": finish.completion_tokens,
            "total_tokens": finish.prompt_tokens + finish.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": finish.cached_tokens}}
