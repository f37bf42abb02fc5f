"""OpenAI request bodies as typed models, and the error body every refusal carries.

Unknown fields are refused with 400, as OpenAI's API does ("Unrecognized request argument"), so
a client never believes a setting took effect when it did not. Fields OpenAI defines that this
server does not implement are accepted only at their neutral value (``n`` 1, penalties 0); any
other value is refused, naming the field. ``logprobs`` takes each endpoint's own shape: a number of
alternatives (0 to 5) for completions, ``true`` with ``top_logprobs`` for chat.

``parse_request`` turns the raw body into one of these models, or a ``RequestError`` whose one line
names what is wrong: not UTF-8, not JSON, not an object, nested absurdly deep, a lone surrogate
(which no tokenizer can encode), or a field pydantic refuses.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model.generation import MAX_SEED

# The deepest a body of these models goes is a chat message's field (body, messages, message,
# field); anything far deeper is hostile, and refused before it can exhaust the stack.
MAX_DEPTH = 16
MAX_INT_DIGITS = 40  # the largest integer a field takes is a 64-bit seed: 19 digits


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
    user: str | None = None  # an end-user id for abuse monitoring; nothing to do with it here

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Common):
    # Text, or token ids (what lm-evaluation-harness sends); a list of one of these is a batch of
    # one (the api refuses longer batches).
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str
    name: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class RequestError(ValueError):
    """A request body this server refuses; ``param`` is the field concerned, if one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


Body = TypeVar("Body", bound=BaseModel)

_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def parse_request(raw: bytes, schema: type[Body]) -> Body:
    """The body as ``schema``, or a RequestError naming the problem."""
    fields = " and ".join(name for name, info in schema.model_fields.items() if info.is_required())
    if not raw.strip():
        raise RequestError(f"the request body is empty; send a JSON object with {fields}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(f"the request body is not UTF-8 (byte {error.start} is {raw[error.start]:#04x}); "
                           "send JSON encoded as UTF-8") from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_int=_read_int)
    except RecursionError:
        raise RequestError(f"the request body nests deeper than {MAX_DEPTH} levels; send a flat JSON object") from None
    except json.JSONDecodeError as error:
        raise RequestError(f"the request body is not valid JSON ({error}); send a JSON object") from None
    except ValueError as error:  # from the two readers below
        raise RequestError(f"the request body has {error}; fix that value") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body is {_JSON_KINDS.get(type(data), 'not an object')}; "
                           f"send a JSON object with {fields}")
    _check_strings(data)
    try:
        return schema.model_validate(data)
    except ValidationError as error:
        raise RequestError(*_describe(error.errors())) from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name}, which is not a JSON number")


def _read_int(digits: str) -> int:
    # Python refuses to convert past a few thousand digits, with advice meant for programmers.
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} characters, more than any field takes")
    return int(digits)


def _check_strings(data: dict) -> None:
    """Refuse nesting past MAX_DEPTH, and any key or string holding a lone surrogate ("\\ud800" is
    valid JSON but no character: it cannot be tokenized, nor echoed back as UTF-8)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise RequestError(f"the request body nests deeper than {MAX_DEPTH} levels; send a flat JSON object")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, ".".join(path) or None)
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, ".".join(path))


def _check_text(text: str, field: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        where = f"{field} has" if field else "the request body has a key with"
        raise RequestError(f"{where} a lone surrogate ({text[error.start]!r} at character {error.start}), "
                           "which is not a Unicode character; send valid text", field) from None


def _describe(errors: list[dict]) -> tuple[str, str | None]:
    """One line for the first problem pydantic found, and the field it concerns."""
    first = errors[0]
    field = ".".join(str(part) for part in first.get("loc", ())) or None
    if first.get("type") == "extra_forbidden":
        return f"unrecognized request argument: {field}; this server does not implement it", field
    if first.get("type") == "missing":
        return f"missing required field: {field}", field
    return f"{field or 'the request body'}: {first.get('msg')} (got {first.get('input')!r:.60})", field
