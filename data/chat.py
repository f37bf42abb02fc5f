"""The chat format, defined once: its special tokens, a conversation rendered to token ids, and a
reply's tool calls read back. Every surface (SFT, ``generate.py --chat``, the Hugging Face export's
Jinja template below, the server) renders through this module.

Each turn is the role's token, the text, and ``<|end|>``. An assistant turn may end with tool calls,
each ``<|call|>``, the function's name and its JSON arguments verbatim (OpenAI's ``function.name`` and
``function.arguments``, so nothing is translated either way; a name never holds ``{``, so no
separator is needed). Each result follows as a ``tool`` turn:

    <|user|>What is 347*812?<|end|><|assistant|><|call|>calculator{"expression":"347*812"}<|end|>
    <|tool|>281764<|end|><|assistant|>281764<|end|>

The tools offered are not written into the prompt: a model this small learns its tools by
fine-tuning, and the list decides which calls ``parse_reply`` accepts and whether ``<|call|>`` may be
sampled. A call is never guessed at. Message text is encoded with special-token matching off, so a
typed "<|end|>" stays text; rendering turn by turn gives the same ids as rendering whole, which lets
a chat reuse the cache of its earlier turns.

``fit_chat`` is the one policy for a conversation longer than the window: learned positions read from
position 0, so the oldest whole messages are dropped (the system prompt is kept), resuming at a user
message so a call is never cut from its result. A run with rotary or no positions whose last exchange
alone does not fit keeps it whole and reads it through its rolling cache; elsewhere that is refused
(``ChatTooLong``).

Tokenizers reserve the chat tokens after ``<|endoftext|>``, then the tool tokens; one from before
tool calls chats and refuses tools (``NO_TOOL_TOKENS``)."""

import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from common.errors import DataError
# Reserved by every tokenizer the project trains, right after <|endoftext|>; the tool tokens follow.
from data.tokenizer import CHAT_SPECIAL_TOKENS, TOOL_SPECIAL_TOKENS
from data.tokenizer import EOT as END_OF_TEXT

ROLES = ("system", "user", "assistant", "tool")
ROLE_TOKENS = {role: f"<|{role}|>" for role in ROLES}
END_OF_TURN = CHAT_SPECIAL_TOKENS[-1]
CALL = TOOL_SPECIAL_TOKENS[-1]
NO_TOOL_TOKENS = ("this run's tokenizer has no tool tokens (<|tool|>, <|call|>): it was trained before tool calls "
                  "existed; pretrain a new run (its tokenizer reserves them) to use tools")
# OpenAI's rule for a function's name; a call's text is the name, then its arguments.
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NAME_PREFIX = re.compile(r"[A-Za-z0-9_-]*")

# The same rendering for transformers' ``apply_chat_template`` and llama.cpp's (the GGUF's), which
# tokenize message text with special tokens recognised, the one way the two can differ. Arguments
# given as an object are written by ``tojson`` (json.dumps' separators); ``tools`` is not rendered.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' + message['role'] + '; use system, user, assistant or tool') }}"
    "{% endif %}"
    "{% if message['content'] is defined and message['content'] is not none and message['content'] is not string %}"
    "{{ raise_exception('a message content must be text') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + (message['content'] if message['content'] is string else '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "{{ '<|call|>' + function['name'] }}"
    "{{ function['arguments'] if function['arguments'] is string else function['arguments'] | tojson }}"
    "{% endfor %}"
    "{{ '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclass(frozen=True)
class ToolCall:
    """A call the assistant makes: OpenAI's ``function.name``, and ``function.arguments``, a JSON
    object as text, rendered verbatim."""

    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls, after its text


@dataclass(frozen=True)
class ChatTokenIds:
    """The ids of the chat special tokens in one tokenizer, and the rule for them in a reply."""

    role: dict[str, int]  # system, user, assistant; and tool when the tokenizer has the tool tokens
    end: int
    end_of_text: int
    call: int | None = None  # <|call|>; None for a tokenizer from before tool calls

    @property
    def reply_end_ids(self) -> tuple[int, ...]:
        """Tokens that end a reply, never shown: ``<|end|>``, and ``<|endoftext|>`` from pretraining."""
        return (self.end, self.end_of_text)

    @property
    def suppress_ids(self) -> tuple[int, ...]:
        """Tokens a reply never samples: the role tokens (``<|tool|>`` too: a result is the tool's to
        write), so no reply opens a turn. The one place the rule is made; every surface applies it."""
        return tuple(sorted(self.role.values()))

    def reply_suppress_ids(self, tools: bool) -> tuple[int, ...]:
        """``suppress_ids``, and ``<|call|>`` too when the reply is offered no tools."""
        calls = () if tools or self.call is None else (self.call,)
        return tuple(sorted((*self.suppress_ids, *calls)))

    @property
    def has_tools(self) -> bool:
        return self.call is not None

    def require_tools(self) -> None:
        """Raise DataError (``NO_TOOL_TOKENS``) for a tokenizer from before tool calls."""
        if not self.has_tools:
            raise DataError(NO_TOOL_TOKENS)

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> "ChatTokenIds":
        tokens = (*CHAT_SPECIAL_TOKENS, *TOOL_SPECIAL_TOKENS, END_OF_TEXT)
        ids = {token: tokenizer.token_to_id(token) for token in tokens}
        missing = [token for token in (*CHAT_SPECIAL_TOKENS, END_OF_TEXT) if ids[token] is None]
        if missing:
            raise DataError(
                f"this tokenizer has no chat tokens ({', '.join(missing)}): it was trained before the "
                "chat format existed; pretrain a new run (its tokenizer reserves them) and chat-tune that"
            )
        tools = all(ids[token] is not None for token in TOOL_SPECIAL_TOKENS)
        roles = ROLES if tools else ROLES[:3]
        return cls({role: ids[ROLE_TOKENS[role]] for role in roles}, ids[END_OF_TURN], ids[END_OF_TEXT],
                   ids[CALL] if tools else None)


class ChatTooLong(DataError):
    """Even the system prompt and the last exchange do not fit the window; ``needed``: their tokens."""

    def __init__(self, message: str, needed: int = 0) -> None:
        super().__init__(message)
        self.needed = needed


@dataclass
class RenderedChat:
    """Token ids of a conversation, and ``loss_mask``: True for the assistant turns' text, calls and
    ``<|end|>``, the targets; role tokens, system and user text and tool results carry no loss."""

    ids: list[int]
    loss_mask: list[bool]


def to_messages(raw: object) -> list[Message]:
    """Check a list of messages (Messages, or mappings in OpenAI's shape) and return Messages; a tool
    message's ``tool_call_id`` and ``name`` are not rendered."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise DataError(f"a conversation must be a list of {{'role', 'content'}} messages, "
                        f"got {type(raw).__name__}")
    messages = []
    for i, item in enumerate(raw):
        if isinstance(item, Message):
            role, content, calls = item.role, item.content, item.tool_calls
        elif isinstance(item, Mapping) and "role" in item and ("content" in item or item.get("tool_calls")):
            role, content = item["role"], item.get("content")
            calls = _tool_calls(item.get("tool_calls"), i)
            if content is None and calls:
                content = ""  # OpenAI's content of an assistant message that only calls
        else:
            raise DataError(f"message {i} must be a mapping with 'role' and 'content', got {item!r:.80}")
        if role not in ROLES:
            raise DataError(f"message {i} has unknown role {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise DataError(f"message {i} content must be a string, got {type(content).__name__}")
        if calls and role != "assistant":
            raise DataError(f"message {i} is a {role} message with tool_calls; only an assistant calls tools")
        messages.append(Message(role, content, tuple(calls)))
    _check_results_follow_calls(messages)
    return messages


def _tool_calls(raw: object, i: int) -> list[ToolCall]:
    """OpenAI's ``tool_calls`` (or bare functions) as ToolCalls; arguments given as an object are
    written as transformers' template writes them (``json.dumps``)."""
    if raw is None:
        return []
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence):
        raise DataError(f"message {i} tool_calls must be a list of calls, got {type(raw).__name__}")
    calls = []
    for j, call in enumerate(raw):
        where = f"message {i} tool call {j}"
        if isinstance(call, ToolCall):
            calls.append(check_tool_call(call, where))
            continue
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or call.get("type", "function") != "function":
            raise DataError(f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}")
        arguments = function.get("arguments")
        if isinstance(arguments, Mapping):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(check_tool_call(ToolCall(function.get("name"), arguments), where))
    return calls


def check_tool_call(call: ToolCall, where: str) -> ToolCall:
    """``call``, if its name is a function's name and its arguments a JSON object (text), so that it
    renders to exactly what ``parse_reply`` reads back; else DataError naming ``where``."""
    if not isinstance(call.name, str) or not FUNCTION_NAME.fullmatch(call.name):
        raise DataError(f"{where} has function name {call.name!r}; a name is 1 to 64 letters, digits, _ or -")
    if not isinstance(call.arguments, str):
        raise DataError(f"{where} arguments must be a JSON object (as text or an object), "
                        f"got {type(call.arguments).__name__}")
    problem = _arguments_problem(call.arguments)
    if problem:
        raise DataError(f"{where} to {call.name}: {problem}")
    return call


def _check_results_follow_calls(messages: Sequence[Message]) -> None:
    """Each tool message answers a call of the assistant message before it, one result per call;
    every call is answered, unless its message ends the conversation (a call still to be run)."""
    expected = 0  # results the last assistant message's calls still wait for
    for i, message in enumerate(messages):
        if message.role == "tool":
            if expected == 0:
                raise DataError(f"message {i} is a tool result that answers no call; it must follow the "
                                "assistant message that made the call")
            expected -= 1
            continue
        if expected:
            raise DataError(f"message {i - 1} leaves {expected} tool call(s) without a result; give one tool "
                            "message per call, after the call")
        expected = len(message.tool_calls)


def chat_text(messages: Iterable[Message], add_generation_prompt: bool = False) -> str:
    """The conversation as text, exactly as CHAT_TEMPLATE renders it."""
    text = "".join(ROLE_TOKENS[m.role] + m.content + "".join(CALL + c.name + c.arguments for c in m.tool_calls)
                   + END_OF_TURN for m in messages)
    return text + (ROLE_TOKENS["assistant"] if add_generation_prompt else "")


def render_chat(
    tokenizer: Tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False
) -> RenderedChat:
    """Token ids and loss mask of ``messages``, with ``add_generation_prompt`` ending in
    ``<|assistant|>``; tools with a tokenizer from before them raise DataError (``NO_TOOL_TOKENS``)."""
    special = ChatTokenIds.of(tokenizer)
    if any(m.role == "tool" or m.tool_calls for m in messages):
        special.require_tools()
    texts = [text for m in messages for text in (m.content, *(c.name + c.arguments for c in m.tool_calls))]
    pieces = iter(encode_plain(tokenizer, texts))
    ids: list[int] = []
    loss_mask: list[bool] = []
    for message in messages:
        turn = [special.role[message.role], *next(pieces)]
        for _ in message.tool_calls:
            turn += [special.call, *next(pieces)]
        turn.append(special.end)
        ids += turn
        loss_mask += [False] + [message.role == "assistant"] * (len(turn) - 1)
    if add_generation_prompt:
        ids.append(special.role["assistant"])
        loss_mask.append(False)
    return RenderedChat(ids, loss_mask)


@dataclass(frozen=True)
class ParsedReply:
    """A generated reply read back: its text before any call, its calls or why they are malformed,
    and ``text``, all of it as written (what a reply whose calls cannot be used shows)."""

    content: str
    calls: tuple[ToolCall, ...]
    error: str | None  # None: every call parsed (or there was none)
    text: str

    @property
    def calls_tools(self) -> bool:
        """The reply holds calls that parsed: they are to be run (or handed to the client)."""
        return bool(self.calls) and self.error is None


def parse_reply(tokenizer: Tokenizer, token_ids: Sequence[int], names: Collection[str] | None = None) -> ParsedReply:
    """Read a generated reply into text and calls. A call must name a function (one of ``names``, when
    given) and give a JSON object; the first that does not is the reply's ``error``, never repaired."""
    special = ChatTokenIds.of(tokenizer)
    ids = list(token_ids)
    while ids and ids[-1] in special.reply_end_ids:
        ids.pop()
    pieces: list[list[int]] = [[]]
    for token in ids:
        if token == special.call:
            pieces.append([])
        else:
            pieces[-1].append(token)
    content, *bodies = [tokenizer.decode(piece, skip_special_tokens=False) for piece in pieces]
    text = CALL.join([content, *bodies])
    calls, error = [], None
    for number, body in enumerate(bodies, start=1):
        name = _NAME_PREFIX.match(body).group()
        problem = _call_problem(name, body[len(name):], names)
        if problem:
            error = f"call {number} {problem}"
            break
        calls.append(ToolCall(name, body[len(name):]))
    return ParsedReply(content, tuple(calls) if error is None else (), error, text)


def _call_problem(name: str, arguments: str, names: Collection[str] | None) -> str | None:
    if not name:
        return "does not begin with a function's name"
    if not FUNCTION_NAME.fullmatch(name):
        return f"names {name[:70]!r}, longer than a function's name may be (64 characters)"
    if names is not None and name not in names:
        return f"names {name!r}, which is not among the tools ({', '.join(names) or 'none'})"
    problem = _arguments_problem(arguments)
    return f"to {name}: {problem}" if problem else None


def _arguments_problem(arguments: str) -> str | None:
    """What keeps ``arguments`` from being a JSON object (None: nothing)."""
    if not arguments.strip():
        return "has no arguments (a JSON object, {} for none)"
    try:
        value = json.loads(arguments)
    except RecursionError:
        return "its arguments nest too deeply to read"
    except ValueError as error:
        return f"its arguments are not JSON ({error})"
    if not isinstance(value, dict):
        return f"its arguments are JSON {type(value).__name__}, not an object"
    return None


def encode_plain(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, with special tokens never matched inside it."""
    previous = tokenizer.encode_special_tokens
    tokenizer.encode_special_tokens = True
    try:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    finally:
        tokenizer.encode_special_tokens = previous


@dataclass(frozen=True)
class FittedChat:
    """A conversation cut to fit: its rendering, and how many of its oldest messages were dropped
    (the system prompt is never among them)."""

    chat: RenderedChat
    dropped: int

    def notice(self, window: int) -> str:
        """What a surface tells its user when messages were dropped."""
        return (f"the conversation outgrew the model's {window}-token window: its {self.dropped} oldest "
                "message(s) were dropped (the system prompt is kept)")


def fit_chat(tokenizer: Tokenizer, messages: Sequence[Message], max_tokens: int, *,
             add_generation_prompt: bool = False, min_tokens: int | None = None, rolls: bool = False) -> FittedChat:
    """``messages`` rendered within ``max_tokens`` tokens, dropping the fewest oldest whole messages
    (keeping any system prompt, resuming at a user message). ``min_tokens``: fit in that many where
    dropping can (room for a reply). Raises ChatTooLong when nothing fits, unless ``rolls`` (a rolling
    cache reads the last exchange however long)."""
    chat = render_chat(tokenizer, messages, add_generation_prompt)
    special = ChatTokenIds.of(tokenizer)
    role_ids = set(special.role.values())
    # Plain text never encodes to a role token, so each one opens a message.
    starts = [i for i, token in enumerate(chat.ids) if token in role_ids][:len(messages)] + [len(chat.ids)]
    first = 1 if messages and messages[0].role == "system" else 0
    head = starts[first]  # the system prompt, kept whole
    cuts = [first] + [i for i in range(first + 1, len(messages)) if messages[i].role == "user"]

    def kept_from(cut: int) -> FittedChat:
        kept = slice(starts[cut], None)
        fitted = RenderedChat(chat.ids[:head] + chat.ids[kept], chat.loss_mask[:head] + chat.loss_mask[kept])
        return FittedChat(fitted, cut - first)

    for budget in dict.fromkeys((max_tokens if min_tokens is None else min_tokens, max_tokens)):
        for cut in cuts:
            if head + len(chat.ids) - starts[cut] <= budget:
                return kept_from(cut)
    if rolls:
        return kept_from(cuts[-1])
    last = len(chat.ids) - starts[cuts[-1]]
    system = f" and the system prompt {head}" if head else ""
    raise ChatTooLong(f"the last message is {last} tokens{system}: more than the {max_tokens} tokens the model's "
                      "window leaves for them; shorten it", needed=head + last)


# A conversation to be answered leaves this share of the window for the reply where dropping old
# messages can make the room, so the next turns do not have to drop messages again at once.
REPLY_ROOM_FRACTION = 0.25


def fit_for_reply(tokenizer: Tokenizer, messages: Sequence[Message], window: int, *, rolls: bool = False) -> FittedChat:
    """``messages`` and the generation prompt, cut to leave room for a reply in ``window`` tokens:
    ``REPLY_ROOM_FRACTION`` of it where dropping allows, at least one token."""
    room = max(1, int(REPLY_ROOM_FRACTION * window))
    return fit_chat(tokenizer, messages, window - 1, add_generation_prompt=True, min_tokens=window - room,
                    rolls=rolls)
