"""Conversations -> token ids and loss masks that fit the model's window, cached on disk.

Each conversation is rendered by ``data.chat.render_chat`` (the one chat template) with the
parent run's tokenizer. Learned absolute positions mean a conversation is always seen from
position 0, so one that is longer than the window (``block_size + 1`` tokens: inputs plus the
shifted targets) is cut by the chat format's one policy (``data.chat.fit_chat``), exactly as a chat
is at inference when its window fills. One whose last exchange alone does not fit, or that keeps
no reply to learn from, is dropped; both are counted.

An entry is one ``.npz`` file (no pickles) in ``data.cache_dir``, written atomically and keyed by
the source, the split settings, the tokenizer's hash and the block size.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from common.files import atomic_output
from data.chat import ChatTokenIds, ChatTooLong, Message, fit_chat
from data.config import DataConfig
from data.sources.conversations import conversations_spec, load_conversations
from data.errors import DataError
from data.prepared.text import POLL_S, PreparedTokenizer, file_sha256, say, token_dtype
from data.tokenizer import eot_id, load_tokenizer

FORMAT_VERSION = 1


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
class PreparedChat(PreparedTokenizer):
    path: Path
    tokenizer_path: Path
    train: ChatSplit
    val: ChatSplit
    meta: dict[str, Any]

    def check_block_size(self, block_size: int) -> None:
        if self.meta["block_size"] != block_size:
            raise DataError(f"prepared chat data is for block_size {self.meta['block_size']}, not {block_size}")


def tokenize_conversations(
    tokenizer: Tokenizer, conversations: list[list[Message]], block_size: int
) -> tuple[ChatSplit, dict[str, int]]:
    """Render, fit and pack ``conversations``; with counts of kept, cut and dropped ones."""
    dtype = token_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    ids: list[int] = []
    mask: list[bool] = []
    offsets = [0]
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
        ids += fitted.chat.ids
        mask += fitted.chat.loss_mask
        offsets.append(len(ids))
    split = ChatSplit(np.asarray(ids, dtype=dtype), np.asarray(mask, dtype=bool), np.asarray(offsets, dtype=np.int64))
    stats = {"conversations": len(split), "cut": cut, "dropped": dropped, "tokens": len(ids),
             "assistant_tokens": int(split.mask.sum())}
    return split, stats


def prepare_chat_data(
    cfg: DataConfig, tokenizer_file: Path, block_size: int, *, progress: bool = True, is_main: bool = True,
    wait_timeout_s: float = 3600.0,
) -> PreparedChat:
    """The cached conversations of ``cfg`` tokenized with ``tokenizer_file`` for ``block_size``."""
    tokenizer_file = Path(tokenizer_file)
    tokenizer = load_tokenizer(tokenizer_file)
    ChatTokenIds.of(tokenizer)  # a tokenizer from before the chat format: say so before any work
    spec = {
        "format_version": FORMAT_VERSION,
        "source": conversations_spec(cfg),
        "split": {"val_fraction": cfg.val_fraction, "split_seed": cfg.split_seed},
        "tokenizer_sha256": file_sha256(tokenizer_file),
        "block_size": block_size,
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(cfg.cache_dir).expanduser() / f"chat-{cfg.source}-{key}.npz"
    if not is_main:
        return _wait_for(path, tokenizer_file, wait_timeout_s)
    if path.is_file():
        data = _open(path, tokenizer_file)
        say(progress, f"data: using cached {path} ({_totals(data.meta)})")
        return data
    start = time.perf_counter()
    conversations = load_conversations(cfg, progress=progress)
    train, train_stats = tokenize_conversations(tokenizer, conversations.train, block_size)
    val, val_stats = tokenize_conversations(tokenizer, conversations.val, block_size)
    for name, split in (("training", train), ("held-out", val)):
        if len(split) == 0:
            raise DataError(
                f"no {name} conversation of {conversations.description} fits in block_size {block_size}: "
                "use shorter conversations or a run with a longer window"
            )
    meta = {
        **spec,
        "description": conversations.description,
        "val_from": conversations.val_from,
        "eot_id": eot_id(tokenizer),
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "splits": {"train": train_stats, "val": val_stats},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as temp, open(temp, "wb") as f:
        np.savez(
            f, meta=np.array(json.dumps(meta)),
            train_ids=train.ids, train_mask=train.mask, train_offsets=train.offsets,
            val_ids=val.ids, val_mask=val.mask, val_offsets=val.offsets,
        )
    say(progress, f"data: prepared {conversations.description}: {_totals(meta)}, "
                   f"{time.perf_counter() - start:.1f} s -> {path}")
    return _open(path, tokenizer_file)


def _open(path: Path, tokenizer_file: Path) -> PreparedChat:
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            splits = {s: ChatSplit(z[f"{s}_ids"], z[f"{s}_mask"], z[f"{s}_offsets"]) for s in ("train", "val")}
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"prepared chat data {path} is unreadable ({e}); delete it and run again") from None
    return PreparedChat(path, tokenizer_file, splits["train"], splits["val"], meta)


def _wait_for(path: Path, tokenizer_file: Path, timeout_s: float) -> PreparedChat:
    deadline = time.monotonic() + timeout_s
    while not path.is_file():
        if time.monotonic() >= deadline:
            raise DataError(f"waited {timeout_s:g} s for the main process to prepare {path}; check its output")
        time.sleep(POLL_S)
    return _open(path, tokenizer_file)


def _totals(meta: dict[str, Any]) -> str:
    return "; ".join(
        f"{name} {s['conversations']:,} conversations ({s['cut']:,} cut to the window, "
        f"{s['dropped']:,} dropped), {s['assistant_tokens']:,} of {s['tokens']:,} tokens learned"
        for name, s in meta["splits"].items()
    )
