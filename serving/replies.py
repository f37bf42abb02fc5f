"""The shape of each response kind, whole or as stream chunks: one class per endpoint.

A reply knows its id, its creation time and the tokens counted so far (the access log reads
them); ``CompletionReply`` and ``ChatReply`` each say, in one place, what their body, their chunks
and the chunks that open their stream look like. Nothing here waits on the engine: that is
``serving.streaming``'s job.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod

from inference.engine import Finish
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
        choice = {"index": 0, **self.content(finish.text), "logprobs": self.logprobs.whole(self.prompt_ids, finish),
                  "finish_reason": finish.reason}
        return {**self.envelope(self.kind, [choice]), "usage": usage(finish)}

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


class ChatReply(Reply):
    """``/v1/chat/completions``: the assistant's message; streamed as deltas after a role chunk."""

    id_prefix, kind, chunk_kind = "chatcmpl", "chat.completion", "chat.completion.chunk"

    def content(self, text: str) -> dict:
        return {"message": {"role": "assistant", "content": text}}

    def chunk(self, text: str | None, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        delta = {} if text is None else {"content": text}
        return self._delta_chunk(delta, finish_reason, logprobs)

    def opening(self) -> list[dict]:
        return [self._delta_chunk({"role": "assistant", "content": ""})]

    def _delta_chunk(self, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return self.envelope(self.chunk_kind, [choice])


def usage(finish: Finish) -> dict:
    return {"prompt_tokens": finish.prompt_tokens, "completion_tokens": finish.completion_tokens,
            "total_tokens": finish.prompt_tokens + finish.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": finish.cached_tokens}}
