"""OpenAI request bodies as typed models (the error body every refusal carries is ``serving.errors``).

Unknown fields are refused with 400, as OpenAI's API does ("Unrecognized request argument"), so
a client never believes a setting took effect when it did not. Fields OpenAI defines that this
server does not implement are accepted only at their neutral value (``n`` 1, penalties 0); any
other value is refused, naming the field. ``logprobs`` takes each endpoint's own shape: a number of
alternatives (0 to 5) for completions, ``true`` with ``top_logprobs`` for chat.

A chat request takes OpenAI's tools protocol (``tools``, ``tool_choice``, the assistant's
``tool_calls`` and the client's ``tool`` results), checked here with OpenAI's own refusals.

``parse_request`` turns the raw body into one of these models, or a one-line ``RequestError``.
Requests are checked here once, against the server's ``ServerRules`` too: the routes trust what
they get. What needs the tokenizer (a prompt's length in tokens, a chat's roles) is checked where
the prompt is encoded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from common.config import describe
from data.chat import FUNCTION_NAME
from inference.sampling import MAX_SEED

# The deepest a body of these models goes is a chat message's field (body, messages, message,
# field); anything far deeper is hostile, and refused before it can exhaust the stack.
MAX_DEPTH = 16
MAX_INT_DIGITS = 40  # the largest integer a field takes is a 64-bit seed: 19 digits


MAX_STOP = 4  # stop strings a request may give, as OpenAI allows
MAX_TOOLS = 128  # functions a request may offer, as OpenAI allows


@dataclass(frozen=True)
class ServerRules:
    """What a request is checked against beyond its shape."""

    model_id: str
    vocab_size: int
    max_tokens_cap: int  # the largest max_tokens a request may ask for
    default_max_tokens: int  # when a request gives none (at most the cap)


def _refuse(message: str, *, param: str | None = None, status: int = 400, code: str | None = None) -> Exception:
    """A refusal raised inside a validator, carried through pydantic to ``parse_request``."""
    return PydanticCustomError("refused", "{message}", {"message": message, "param": param, "status": status,
                                                        "code": code})


def _rules(info: ValidationInfo) -> ServerRules:
    return info.context["rules"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """The fields every generation request shares, completion and chat alike."""

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
    _max_new_tokens: int = PrivateAttr(default=0)

    @model_validator(mode="after")
    def _check_common(self, info: ValidationInfo) -> GenerationRequest:
        rules = _rules(info)
        if self.model != rules.model_id:
            raise _refuse(f"model {self.model!r} does not exist; this server serves {rules.model_id!r} "
                          "(GET /v1/models)", param="model", status=404, code="model_not_found")
        requested = self.requested_max_tokens()
        if requested is not None and requested > rules.max_tokens_cap:
            raise _refuse(f"max_tokens is {requested} but this server allows at most {rules.max_tokens_cap}; "
                          "ask for fewer", param="max_tokens")
        self._max_new_tokens = min(rules.default_max_tokens, rules.max_tokens_cap) if requested is None else requested
        stop = self.stop_strings()
        if len(stop) > MAX_STOP or any(not s for s in stop):
            raise _refuse(f"stop must be up to {MAX_STOP} non-empty strings", param="stop")
        return self

    @property
    def max_new_tokens(self) -> int:
        """The tokens to generate at most: the request's max_tokens, or the server's default."""
        return self._max_new_tokens

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(GenerationRequest):
    # Text, or token ids (what lm-evaluation-harness sends); a list of one of these is a batch of
    # one, and becomes that one prompt: a longer batch is refused.
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False

    @model_validator(mode="after")
    def _check_prompt(self, info: ValidationInfo) -> CompletionRequest:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise _refuse(f"prompt is a batch of {len(prompt)} prompts; this server takes one prompt per "
                              "request: send them one at a time", param="prompt")
            prompt = self.prompt = prompt[0]
        if isinstance(prompt, list):
            vocab = _rules(info).vocab_size
            if not prompt:
                raise _refuse("prompt is an empty list of token ids; send at least one", param="prompt")
            bad = next((i for i in prompt if not 0 <= i < vocab), None)
            if bad is not None:
                raise _refuse(f"prompt has token id {bad}, outside this model's vocabulary (0 to {vocab - 1})",
                              param="prompt")
        if self.stream and self.echo and self.logprobs is not None:
            raise _refuse("echo with logprobs is answered whole, not streamed; send stream: false", param="echo")
        return self


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: str  # a JSON object, as text


class ToolCallItem(BaseModel):
    """A call in an assistant message of the history, as the client received it."""

    model_config = ConfigDict(extra="forbid")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: str | None = None  # None only for an assistant message that calls tools
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers
    # Fields of the assistant message this server returned, which clients send back as they got
    # them: accepted at their empty values and not rendered.
    refusal: None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(tool.function.name for tool in self.tools or ())

    @property
    def choice(self) -> str:
        """``tool_choice`` as one word: none, auto or required, or the name of the function forced.
        OpenAI's defaults: none without tools, auto with them."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return self.tool_choice or ("auto" if self.tools else "none")

    @property
    def may_call(self) -> bool:
        return self.choice != "none"

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise _refuse("top_logprobs needs logprobs: true", param="top_logprobs")
        return self

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _check_tool_choice(cls, value: Any) -> Any:
        if value is None or value in ("none", "auto", "required") or isinstance(value, dict):
            return value
        raise _refuse(f"tool_choice must be none, auto, required or {{\"type\": \"function\", \"function\": "
                      f"{{\"name\": ...}}}}, got {value!r:.60}", param="tool_choice")

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        names = self.tool_names
        for i, name in enumerate(names):
            if not FUNCTION_NAME.fullmatch(name):
                raise _refuse(f"tools.{i}.function.name is {name!r}; a name is 1 to 64 letters, digits, _ or -",
                              param=f"tools.{i}.function.name")
            if name in names[:i]:
                raise _refuse(f"tools holds two functions named {name!r}; give each once", param="tools")
        if self.tool_choice is not None and not self.tools:
            raise _refuse("tool_choice is only allowed when tools are specified", param="tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice) and self.choice not in names:
            raise _refuse(f"tool_choice names {self.choice!r}, which is not among tools ({', '.join(names)})",
                          param="tool_choice")
        if self.logprobs and self.may_call:
            raise _refuse("logprobs is not supported with tools on this server; drop one, or set tool_choice: none",
                          param="logprobs")
        return self

    @model_validator(mode="after")
    def _check_tool_messages(self) -> ChatCompletionRequest:
        """Calls only from the assistant, results that answer them by id, none left unanswered."""
        waiting: list[str] = []  # ids of the last calls not yet answered
        for i, message in enumerate(self.messages):
            where = f"messages.{i}"
            if message.role == "tool":
                if message.tool_call_id is None:
                    raise _refuse(f"{where}: a tool message needs the tool_call_id of the call it answers",
                                  param=f"{where}.tool_call_id")
                if message.tool_call_id not in waiting:
                    raise _refuse(f"{where}: tool_call_id {message.tool_call_id!r} answers no call of the assistant "
                                  "message before it", param=f"{where}.tool_call_id")
                waiting.remove(message.tool_call_id)
                continue
            if waiting:
                raise _refuse(f"an assistant message with tool_calls must be followed by tool messages answering "
                              f"each call; no answer to {', '.join(waiting)}", param=f"messages.{i - 1}")
            if message.tool_calls and message.role != "assistant":
                raise _refuse(f"{where}: only an assistant message has tool_calls", param=f"{where}.tool_calls")
            if message.content is None and not message.tool_calls:
                raise _refuse(f"{where}: content is missing; only an assistant message that calls tools may "
                              "leave it null", param=f"{where}.content")
            waiting = [call.id for call in message.tool_calls or ()]
        if waiting:
            raise _refuse(f"an assistant message with tool_calls must be followed by tool messages answering each "
                          f"call; no answer to {', '.join(waiting)}", param="messages")
        return self


class RequestError(ValueError):
    """A request body this server refuses: ``param`` is the field concerned, if one is; ``status``
    the HTTP status (404 for a model it does not serve, else 400); ``code`` OpenAI's error code."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


Body = TypeVar("Body", bound=BaseModel)

_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def parse_request(raw: bytes, schema: type[Body], rules: ServerRules) -> Body:
    """The body as ``schema``, checked against ``rules``, or a RequestError naming the problem."""
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
        return schema.model_validate(data, context={"rules": rules})
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "refused":
            refusal = first["ctx"]
            raise RequestError(refusal["message"], refusal["param"], status=refusal["status"],
                               code=refusal["code"]) from None
        raise RequestError(*_describe(error, schema)) from None


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


def _describe(error: ValidationError, schema: type[BaseModel]) -> tuple[str, str | None]:
    """One line for a problem pydantic found, and the field it concerns (the config's formatter,
    in OpenAI's words for a field it does not know or one left out)."""
    field, line = describe(error, schema, wording={
        "extra_forbidden": "unrecognized request argument: {key}; this server does not implement it",
        "missing": "missing required field: {key}"})
    return line, field or None
