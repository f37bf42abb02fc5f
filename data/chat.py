"""The chat format, defined once: its special tokens, and a conversation rendered to token ids.

A conversation is a list of messages, each a role (system, user or assistant) and its text. Every
turn is the role's token, the text as ordinary tokens, and the end-of-turn token:

    <|system|>You are Hamlet.<|end|><|user|>Who's there?<|end|><|assistant|>Nay, answer me.<|end|>

A reply is generated after a bare ``<|assistant|>`` and is over when the model emits ``<|end|>``
(or ``<|endoftext|>``); the role tokens are never sampled in a reply (``ChatTokenIds``).
Nothing else renders a conversation: supervised fine-tuning, ``generate.py --chat``, the Hugging
Face export (as the Jinja template below) and the server all call this module.

The text of a message is encoded with special-token matching off, so a user who types "<|end|>"
gets those characters, never the control token. Rendering the conversation turn by turn gives
the same ids as rendering it whole, which is what lets a chat reuse the cache of its earlier turns.

A conversation longer than the model's window is cut by one policy, ``fit_chat``, for every
surface (the REPL, the server's chat endpoint and its page, SFT preparation): learned positions
mean a conversation is always read from position 0, so its oldest whole messages are dropped (the
system prompt is kept) until the rest fits, resuming at a user message. The caller reports
``FittedChat.dropped``. A run with rotary or no positions drops old messages in the same way (whole
messages keep the conversation as the template renders it); only where its last exchange alone does
not fit does it keep that whole and read it through its rolling cache. Elsewhere such a
conversation is refused (``ChatTooLong``) in one line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from data.errors import DataError

ROLES = ("system", "user", "assistant")
ROLE_TOKENS = {role: f"<|{role}|>" for role in ROLES}
END_OF_TURN = "<|end|>"
END_OF_TEXT = "<|endoftext|>"  # the tokenizer's document separator (data.tokenizer.EOT)
# Reserved by every tokenizer the project trains, right after <|endoftext|>.
CHAT_SPECIAL_TOKENS = (*ROLE_TOKENS.values(), END_OF_TURN)

# The same rendering for transformers' ``apply_chat_template`` (tokenizer_config.json). Message
# text there is tokenized with special tokens recognised, the one way the two can differ.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role'] + '; use system, user or assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class ChatTokenIds:
    """The ids of the chat special tokens in one tokenizer, and the rule for them in a reply."""

    role: dict[str, int]
    end: int
    end_of_text: int

    @property
    def reply_end_ids(self) -> tuple[int, ...]:
        """Tokens that end a reply, never shown as text: ``<|end|>``, and ``<|endoftext|>``, which a
        chat model may still produce from pretraining."""
        return (self.end, self.end_of_text)

    @property
    def suppress_ids(self) -> tuple[int, ...]:
        """Tokens a reply never samples (their logits are -inf): the role tokens, so the model can
        neither open a new turn nor print a control token as text. The one place the rule is made;
        the CLI, the server and the export's generation config all apply it."""
        return tuple(sorted(self.role.values()))

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ChatTokenIds:
        ids = {token: tokenizer.token_to_id(token) for token in (*CHAT_SPECIAL_TOKENS, END_OF_TEXT)}
        missing = [token for token, token_id in ids.items() if token_id is None]
        if missing:
            raise DataError(
                f"this tokenizer has no chat tokens ({', '.join(missing)}): it was trained before the "
                "chat format existed; pretrain a new run (its tokenizer reserves them) and chat-tune that"
            )
        return cls({role: ids[token] for role, token in ROLE_TOKENS.items()}, ids[END_OF_TURN], ids[END_OF_TEXT])


class ChatTooLong(DataError):
    """Even the system prompt and the last exchange do not fit the window."""


@dataclass
class RenderedChat:
    """Token ids of a conversation, and which of them a fine-tuned model learns to produce.

    ``loss_mask[i]`` is True for the tokens of assistant replies, each reply's ``<|end|>``
    included: those are the targets. Role tokens, system and user text carry no loss.
    """

    ids: list[int]
    loss_mask: list[bool]


def to_messages(raw: object) -> list[Message]:
    """Check a list of ``{"role", "content"}`` mappings (or Messages) and return Messages."""
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise DataError(f"a conversation must be a list of {{'role', 'content'}} messages, "
                        f"got {type(raw).__name__}")
    messages = []
    for i, item in enumerate(raw):
        if isinstance(item, Message):
            role, content = item.role, item.content
        elif isinstance(item, Mapping) and "role" in item and "content" in item:
            role, content = item["role"], item["content"]
        else:
            raise DataError(f"message {i} must be a mapping with 'role' and 'content', got {item!r:.80}")
        if role not in ROLES:
            raise DataError(f"message {i} has unknown role {role!r}; use one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise DataError(f"message {i} content must be a string, got {type(content).__name__}")
        messages.append(Message(role, content))
    return messages


def chat_text(messages: Iterable[Message], add_generation_prompt: bool = False) -> str:
    """The conversation as text, exactly as CHAT_TEMPLATE renders it."""
    text = "".join(f"{ROLE_TOKENS[m.role]}{m.content}{END_OF_TURN}" for m in messages)
    return text + (ROLE_TOKENS["assistant"] if add_generation_prompt else "")


def render_chat(
    tokenizer: Tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False
) -> RenderedChat:
    """Token ids and loss mask of ``messages``; with ``add_generation_prompt``, ending in the
    ``<|assistant|>`` token a reply is generated after."""
    special = ChatTokenIds.of(tokenizer)
    ids: list[int] = []
    loss_mask: list[bool] = []
    for message, content_ids in zip(messages, encode_plain(tokenizer, [m.content for m in messages])):
        learned = message.role == "assistant"
        ids += [special.role[message.role], *content_ids, special.end]
        loss_mask += [False] + [learned] * (len(content_ids) + 1)
    if add_generation_prompt:
        ids.append(special.role["assistant"])
        loss_mask.append(False)
    return RenderedChat(ids, loss_mask)


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
    """``messages`` rendered within ``max_tokens`` tokens, dropping the fewest oldest whole messages.

    The kept part is the system prompt (when the conversation begins with one) and the most recent
    messages from a user message on. ``min_tokens`` (<= max_tokens): drop messages until the
    conversation fits in that many where it can (room for a reply), settling for ``max_tokens``
    when only the last exchange is left. Raises ChatTooLong when nothing fits, unless ``rolls``: a
    model whose window rolls (rotary or no positions) reads a longer prompt through its rolling
    cache, so the last exchange is then kept whole, with the system prompt, however long."""
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
                      "window leaves for them; shorten it")


# A conversation to be answered leaves this share of the window for the reply where dropping old
# messages can make the room, so the next turns do not have to drop messages again at once.
REPLY_ROOM_FRACTION = 0.25


def fit_for_reply(tokenizer: Tokenizer, messages: Sequence[Message], window: int, *, rolls: bool = False) -> FittedChat:
    """``messages`` and the generation prompt, cut to leave room for a reply in ``window`` tokens:
    ``REPLY_ROOM_FRACTION`` of it where dropping messages allows, and always at least one token;
    ``rolls`` as in ``fit_chat``."""
    room = max(1, int(REPLY_ROOM_FRACTION * window))
    return fit_chat(tokenizer, messages, window - 1, add_generation_prompt=True, min_tokens=window - room,
                    rolls=rolls)
