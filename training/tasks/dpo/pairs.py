"""Reply pairs for preference optimisation (``data.format: preference``), from local .jsonl/.parquet
files or a hub dataset, in either of TRL's two explicit-prompt shapes (mixable within a row):

- standard: ``prompt``, ``chosen`` and ``rejected`` are text (one user turn, one assistant turn);
- conversational: ``prompt`` is a list of ``{"role", "content"}`` messages, ``chosen`` and
  ``rejected`` lists that begin with the assistant's reply.

Each row is checked when read; a bad one is an error naming the file and line (or dataset and row)
and what is wrong with the pair. Held-out pairs come as held-out conversations do
(``data.sources.conversations.load_examples``)."""

from dataclasses import dataclass, field
from typing import Any

from common.errors import DataError
from data.chat import Message, to_messages
from data.config import DataConfig
from data.sources.conversations import ExampleSet, load_examples
from data.sources.rows import SourceRows

PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    """A prompt (ending before the reply) and two replies to it, each starting with the assistant's turn."""

    prompt: tuple[Message, ...]
    chosen: tuple[Message, ...]
    rejected: tuple[Message, ...]
    where: str = field(default="", compare=False)  # the file and line it came from, for errors about it

    def to_row(self) -> dict[str, Any]:
        """The pair as a conversational row, the shape ``pair_from_row`` reads back."""
        def messages(part: tuple[Message, ...]) -> list[dict[str, str]]:
            return [{"role": m.role, "content": m.content} for m in part]

        return {"prompt": messages(self.prompt), "chosen": messages(self.chosen), "rejected": messages(self.rejected)}


def load_preferences(cfg: DataConfig, *, progress: bool = False) -> ExampleSet:
    """The configured reply pairs, checked, split into training and held-out ones."""
    return load_examples(cfg, dataset_preferences, progress=progress)


def dataset_preferences(source: SourceRows) -> list[PreferencePair]:
    missing = [c for c in PREFERENCE_COLUMNS if c not in source.columns]
    if missing:
        raise DataError(
            f"{source.description} has no {', '.join(repr(c) for c in missing)} column (columns: "
            f"{', '.join(source.columns) or 'none'}): give each pair as prompt, chosen and rejected, as text or as "
            "lists of {role, content} messages"
        )
    return [pair_from_row(row, where) for where, row in source.rows]


def pair_from_row(row: dict[str, Any], where: str) -> PreferencePair:
    """One row (either shape) as a checked pair; ``where`` names the row in errors."""
    try:
        prompt = _part(row.get("prompt"), "user", "prompt")
        if prompt[-1].role == "assistant":
            raise DataError("the prompt ends with an assistant turn; the replies to compare belong in chosen/rejected")
        return PreferencePair(prompt, _reply(row.get("chosen"), "chosen"),
                              _reply(row.get("rejected"), "rejected"), where)
    except DataError as e:
        raise DataError(f"{where}: {e}") from None


def _reply(raw: object, name: str) -> tuple[Message, ...]:
    reply = _part(raw, "assistant", name)
    if reply[0].role != "assistant":
        raise DataError(f"{name} must begin with the assistant's reply, not a {reply[0].role} turn")
    return reply


def _part(raw: object, text_role: str, name: str) -> tuple[Message, ...]:
    """Text as one ``text_role`` turn, or a checked non-empty list of messages."""
    if raw is None:  # a column other rows of the file have
        raise DataError(f"the pair has no {name}; give it prompt, chosen and rejected")
    if isinstance(raw, str):
        return (Message(text_role, raw),)
    try:
        messages = tuple(to_messages(raw))
    except DataError as e:
        raise DataError(f"{name}: {e}") from None
    if not messages:
        raise DataError(f"{name} is an empty list of messages")
    return messages
