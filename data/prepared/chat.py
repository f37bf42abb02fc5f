"""Conversations -> token ids and loss masks that fit the model's window, cached on disk.

Each conversation is rendered by ``data.chat.render_chat`` with the parent run's tokenizer, and one
longer than ``block_size + 1`` tokens is cut by ``data.chat.fit_chat``, exactly as a chat is at
inference. One whose last exchange alone does not fit, or that keeps no reply, is dropped; both are
counted. An entry of the prepared-data cache (``data.prepared.cache``), keyed by the source, split,
tokenizer hash and block size, is `<cache_dir>/chat-<source>-<key>/`: one checksummed
``conversations.npz`` (no pickles)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
from tokenizers import Tokenizer

from common.errors import DataError
from data.chat import ChatTokenIds, ChatTooLong, Message, RenderedChat, fit_chat
from data.config import DataConfig
from data.prepared import cache
from data.prepared.token_files import token_dtype
from data.sources.conversations import ConversationSet, conversations_spec, load_conversations
from data.tokenizer import eot_id, load_tokenizer

# Bump when the entry layout changes: old entries then stop matching. 2: a directory in the shared
# cache with a checksummed .npz (1 was a bare .npz beside it, which is no longer read).
FORMAT_VERSION = 2
CONVERSATIONS_FILE = "conversations.npz"
_SPLITS = ("train", "val")
Split = TypeVar("Split")


@dataclass
class ChatSplit:
    """Conversations as one flat array of ids and of loss-mask flags, cut at ``offsets``."""

    ids: np.ndarray
    mask: np.ndarray  # bool: the token is a target the model learns (assistant text and <|end|>)
    offsets: np.ndarray  # int64, len = conversations + 1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def conversation(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.offsets[i], self.offsets[i + 1]
        return self.ids[start:end], self.mask[start:end]

    def first_reply_prompt(self, i: int) -> list[int]:
        """Conversation i's ids up to its first reply: what a chat shows the model before it answers."""
        ids, mask = self.conversation(i)
        return ids[: int(np.argmax(mask))].tolist()


@dataclass
class PreparedSequences(cache.TokenizerMixin, Generic[Split]):
    """A finished entry of rendered sequences, a training and a held-out split, made with the
    tokenizer at ``tokenizer_path``; each kind says how its splits are read and checked."""

    directory: Path
    tokenizer_path: Path
    train: Split
    val: Split
    meta: dict[str, Any]

    what: ClassVar[str]  # the entry in error messages
    format_version: ClassVar[int]

    @classmethod
    def open(cls, directory: Path, tokenizer_file: Path) -> "PreparedSequences":
        """Open an entry, checking its sequences against their recorded checksum and shape;
        raises DataError if they do not match."""
        meta = cache.read_meta(directory, cls.format_version)
        splits = cls._read_splits(directory, meta)
        prepared = cls(directory, Path(tokenizer_file), splits["train"], splits["val"], meta)
        cache.open_checked(directory, prepared._check_shape)
        return prepared

    @classmethod
    def _read_splits(cls, directory: Path, meta: dict[str, Any]) -> dict[str, Split]:
        raise NotImplementedError

    def _check_shape(self) -> None:
        raise NotImplementedError

    def check_block_size(self, block_size: int) -> None:
        check_entry_block_size(self.meta, block_size, self.what)


class PreparedChat(PreparedSequences[ChatSplit]):
    """A finished chat entry: conversations."""

    what = "prepared chat data"
    format_version = FORMAT_VERSION

    @classmethod
    def _read_splits(cls, directory: Path, meta: dict[str, Any]) -> dict[str, ChatSplit]:
        return read_splits(directory, meta, _SPLITS, cls.what)

    def _check_shape(self) -> None:
        for name in _SPLITS:
            check_split(self.directory, name, getattr(self, name), self.meta["splits"][name]["tokens"], self.meta,
                        self.what)


def read_splits(directory: Path, meta: dict[str, Any], names: tuple[str, ...], what: str) -> dict[str, ChatSplit]:
    """The splits ``names`` of an entry's sequences file, checked against the checksum its meta records."""
    path = directory / CONVERSATIONS_FILE
    recorded = cache.open_checked(directory, lambda: meta["conversations_sha256"])
    cache.check_file_sha256(path, recorded, what)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {s: ChatSplit(z[f"{s}_ids"], z[f"{s}_mask"], z[f"{s}_offsets"]) for s in names}
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"{what} {path} is unreadable ({e}); {cache.REBUILD_ADVICE}") from None


def write_splits(temp: Path, splits: dict[str, ChatSplit]) -> str:
    """Write ``splits`` as the entry's sequences file in ``temp``; return its checksum for the meta."""
    path = temp / CONVERSATIONS_FILE
    arrays = {}
    for name, split in splits.items():
        arrays.update({f"{name}_ids": split.ids, f"{name}_mask": split.mask, f"{name}_offsets": split.offsets})
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return cache.file_sha256(path)


def check_split(directory: Path, name: str, split: ChatSplit, tokens: int, meta: dict[str, Any], what: str) -> None:
    """Refuse a split whose arrays disagree with the ``tokens`` its meta recorded, or hold ids past the vocabulary."""
    if not len(split.ids) == len(split.mask) == split.offsets[-1] == tokens:
        raise DataError(f"{what} in {directory} does not match its {name} counts; {cache.REBUILD_ADVICE}")
    if len(split.ids) and int(split.ids.max()) >= int(meta["vocab_size"]):
        raise DataError(f"{what} in {directory} holds ids beyond the vocabulary; {cache.REBUILD_ADVICE}")


def check_entry_block_size(meta: dict[str, Any], block_size: int, what: str) -> None:
    if meta["block_size"] != block_size:
        raise DataError(f"{what} is for block_size {meta['block_size']}, not {block_size}")


def tokenize_conversations(
    tokenizer: Tokenizer, conversations: list[list[Message]], block_size: int
) -> tuple[ChatSplit, dict[str, int]]:
    """Render, fit and pack ``conversations``; with counts of kept, cut and dropped ones."""
    kept: list[RenderedChat] = []
    cut = dropped = 0
    for conversation in conversations:
        try:
            fitted = fit_chat(tokenizer, conversation, block_size + 1)
        except ChatTooLong:
            fitted = None
        if fitted is None or not any(fitted.chat.loss_mask):  # nothing left to learn from
            dropped += 1
            continue
        cut += fitted.dropped > 0
        kept.append(fitted.chat)
    split = pack_sequences(tokenizer, kept)
    stats = {"conversations": len(split), "cut": cut, "dropped": dropped, "tokens": len(split.ids),
             "assistant_tokens": int(split.mask.sum())}
    return split, stats


def pack_sequences(tokenizer: Tokenizer, sequences: list[RenderedChat]) -> ChatSplit:
    """Rendered sequences as one split, in order."""
    dtype = token_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    ids = np.asarray([token for s in sequences for token in s.ids], dtype=dtype)
    mask = np.asarray([flag for s in sequences for flag in s.loss_mask], dtype=bool)
    offsets = np.cumsum([0] + [len(s.ids) for s in sequences], dtype=np.int64)
    return ChatSplit(ids, mask, offsets)


def prepare_chat_data(
    cfg: DataConfig, tokenizer_file: Path, block_size: int, *, progress: bool = True, is_main: bool = True,
    wait_timeout_s: float = 3600.0,
) -> PreparedChat:
    """The cached conversations of ``cfg`` tokenized with ``tokenizer_file`` for ``block_size``."""
    tokenizer_file = Path(tokenizer_file)
    tokenizer = load_tokenizer(tokenizer_file)
    special = ChatTokenIds.of(tokenizer)  # a tokenizer from before the chat format: say so before any work
    if cfg.source == "calculator":
        special.require_tools()  # and one from before tool calls, for conversations that are all calls
    spec = chat_cache_spec(cfg, tokenizer_file, block_size)

    def build(temp: Path) -> dict[str, Any]:
        conversations = load_conversations(cfg, progress=progress)
        return {**spec, **_write_conversations(temp, tokenizer, conversations, block_size)}

    return cache.open_or_build(
        chat_entry_dir(cfg, spec), open_entry=lambda entry: PreparedChat.open(entry, tokenizer_file), build=build,
        totals=_totals, is_main=is_main, progress=progress, wait_timeout_s=wait_timeout_s,
    )


def chat_cache_spec(cfg: DataConfig, tokenizer_file: Path, block_size: int) -> dict[str, Any]:
    """What decides a chat entry's contents."""
    return {
        "format_version": FORMAT_VERSION,
        "source": conversations_spec(cfg),
        "split": {"val_fraction": cfg.val_fraction, "split_seed": cfg.split_seed},
        "tokenizer_sha256": cache.file_sha256(tokenizer_file),
        "block_size": block_size,
    }


def chat_entry_dir(cfg: DataConfig, spec: dict[str, Any]) -> Path:
    return cache.entry_path(cfg.cache_dir, f"chat-{cfg.source}", spec)


def _write_conversations(
    temp: Path, tokenizer: Tokenizer, conversations: ConversationSet, block_size: int
) -> dict[str, Any]:
    """Tokenize both splits into ``temp``'s conversations file; return what the meta records of them."""
    train, train_stats = tokenize_conversations(tokenizer, conversations.train, block_size)
    val, val_stats = tokenize_conversations(tokenizer, conversations.val, block_size)
    for name, split in (("training", train), ("held-out", val)):
        if len(split) == 0:
            raise DataError(
                f"no {name} conversation of {conversations.description} fits in block_size {block_size}: "
                "use shorter conversations or a run with a longer window"
            )
    return {
        "description": conversations.description,
        "val_from": conversations.val_from,
        "eot_id": eot_id(tokenizer),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "splits": {"train": train_stats, "val": val_stats},
        "conversations_sha256": write_splits(temp, {"train": train, "val": val}),
    }


def _totals(meta: dict[str, Any]) -> str:
    return "; ".join(
        f"{name} {s['conversations']:,} conversations ({s['cut']:,} cut to the window, "
        f"{s['dropped']:,} dropped), {s['assistant_tokens']:,} of {s['tokens']:,} tokens learned"
        for name, s in meta["splits"].items()
    )
