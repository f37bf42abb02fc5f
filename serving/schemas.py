"""OpenAI request bodies as typed models, and the error body every refusal carries.

Unknown fields are refused with 400, as OpenAI's API does ("Unrecognized request argument"), so
a client never believes a setting took effect when it did not. Fields OpenAI defines that this
server does not implement are accepted only at their neutral value (``n`` 1, penalties 0, no
logprobs); any other value is refused, naming the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from model.generation import MAX_SEED


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI fields accepted only at their neutral value:
    n: Literal[1] = 1
    presence_penalty: Literal[0] = 0
    frequency_penalty: Literal[0] = 0
    logprobs: Literal[False] | None = None
    user: str | None = None  # an end-user id for abuse monitoring; nothing to do with it here

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Common):
    prompt: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str
    name: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name for max_tokens

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
