"""Reply pairs -> two sequences each (prompt + chosen, prompt + rejected) that fit the window, cached.

Each sequence is the chat format's rendering (``data.chat``) with the parent's tokenizer: the prompt
with its generation prompt, then the reply's text and ``<|end|>``, which join into exactly what the
whole conversation renders to. The loss mask is on the reply alone. Both sequences share one prompt,
cut by ``fit_chat`` to leave room for the longer reply within ``block_size + 1`` tokens; a pair whose
reply alone does not fit is dropped, and cut and dropped pairs are counted. An entry of the prepared
data cache is `<cache_dir>/preference-<source>-<key>/`, its sequences in one ``conversations.npz``."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from common.errors import DataError
from data.chat import ChatTokenIds, ChatTooLong, RenderedChat, fit_chat, render_chat
from data.config import DataConfig
from data.prepared import cache
from data.prepared.chat import (
    ChatSplit, PreparedSequences, check_split, chat_cache_spec, pack_sequences, read_splits, write_splits,
)
from training.tasks.dpo.pairs import PreferencePair, load_preferences
from data.tokenizer import eot_id, load_tokenizer

FORMAT_VERSION = 1
_SPLITS = ("train", "val")
_SIDES = ("chosen", "rejected")
_WHAT = "prepared preference data"


@dataclass
class PreferenceSplit:
    """Pairs as two aligned sets of sequences: pair i is ``chosen`` i against ``rejected`` i."""

    chosen: ChatSplit
    rejected: ChatSplit

    def __len__(self) -> int:
        return len(self.chosen)

    @property
    def lengths(self) -> np.ndarray:
        """Each pair's longer sequence: what a batch holding the pair is padded to at least."""
        return np.maximum(self.chosen.lengths, self.rejected.lengths)

    def first_reply_prompt(self, i: int) -> list[int]:
        """Pair i's prompt, ending in the generation prompt: what the model replies to."""
        return self.chosen.first_reply_prompt(i)


class PreparedPreferences(PreparedSequences[PreferenceSplit]):
    """A finished preference entry: reply pairs."""

    what = _WHAT
    format_version = FORMAT_VERSION

    @classmethod
    def _read_splits(cls, directory: Path, meta: dict[str, Any]) -> dict[str, PreferenceSplit]:
        names = tuple(f"{split}_{side}" for split in _SPLITS for side in _SIDES)
        arrays = read_splits(directory, meta, names, _WHAT)
        return {split: PreferenceSplit(arrays[f"{split}_chosen"], arrays[f"{split}_rejected"]) for split in _SPLITS}

    def _check_shape(self) -> None:
        for split in _SPLITS:
            pairs, stats = getattr(self, split), self.meta["splits"][split]
            for side in _SIDES:
                check_split(self.directory, f"{split} {side}", getattr(pairs, side), stats[f"{side}_tokens"],
                            self.meta, _WHAT)
            if len(pairs.chosen) != len(pairs.rejected) or len(pairs) != stats["pairs"]:
                raise DataError(f"{_WHAT} in {self.directory} does not match its {split} counts; {cache.REBUILD_ADVICE}")


class PairTooLong(DataError):
    """A reply pair that no cut of its prompt fits in the window; the message says which part is too long."""


def render_pair(tokenizer: Tokenizer, pair: PreferencePair, window: int) -> tuple[RenderedChat, RenderedChat, int]:
    """(prompt + chosen, prompt + rejected, messages dropped from the prompt) within ``window``
    tokens, the loss mask on the replies alone; PairTooLong when even the prompt's last message
    leaves no room for the longer reply."""
    replies = [render_chat(tokenizer, reply) for reply in (pair.chosen, pair.rejected)]
    reply = max(len(r.ids) for r in replies) - 1  # the reply's role token is the prompt's
    try:
        fitted = fit_chat(tokenizer, pair.prompt, window - reply, add_generation_prompt=True)
    except ChatTooLong as e:
        if reply + 1 >= window:
            raise PairTooLong(f"its longer reply is {reply:,} tokens, more than the whole window ({window - 1:,} "
                              "tokens, model.block_size); shorten the replies") from None
        kept = "its last message" + (" and system prompt" if pair.prompt[0].role == "system" else "")
        raise PairTooLong(f"its prompt needs {e.needed:,} tokens even cut to {kept}, more than the {window - reply:,} "
                          f"that the window ({window - 1:,} tokens, model.block_size) leaves beside its "
                          f"{reply:,}-token reply; shorten the prompt") from None
    prompt = fitted.chat.ids
    chosen, rejected = (RenderedChat(prompt + r.ids[1:], [False] * len(prompt) + r.loss_mask[1:]) for r in replies)
    return chosen, rejected, fitted.dropped


def tokenize_pairs(tokenizer: Tokenizer, pairs: list[PreferencePair], block_size: int) -> tuple[PreferenceSplit, dict[str, int]]:
    """Render, fit and pack ``pairs``; with counts of kept, cut and dropped ones."""
    sides: dict[str, list[RenderedChat]] = {side: [] for side in _SIDES}
    cut = dropped = 0
    for pair in pairs:
        try:
            chosen, rejected, messages_dropped = render_pair(tokenizer, pair, block_size + 1)
        except PairTooLong:
            dropped += 1
            continue
        cut += messages_dropped > 0
        sides["chosen"].append(chosen)
        sides["rejected"].append(rejected)
    split = PreferenceSplit(pack_sequences(tokenizer, sides["chosen"]), pack_sequences(tokenizer, sides["rejected"]))
    stats = {"pairs": len(split), "cut": cut, "dropped": dropped,
             "chosen_tokens": len(split.chosen.ids), "rejected_tokens": len(split.rejected.ids)}
    return split, stats


def _first_too_long(tokenizer: Tokenizer, pairs: list[PreferencePair], block_size: int) -> str:
    """Where the first pair that does not fit is, and why."""
    for pair in pairs:
        try:
            render_pair(tokenizer, pair, block_size + 1)
        except PairTooLong as e:
            return f"{pair.where or 'a pair'}: {e}"
    return "no pair"


def prepare_preference_data(
    cfg: DataConfig, tokenizer_file: Path, block_size: int, *, progress: bool = True, is_main: bool = True,
    wait_timeout_s: float = 3600.0,
) -> PreparedPreferences:
    """The cached reply pairs of ``cfg`` tokenized with ``tokenizer_file`` for ``block_size``."""
    tokenizer_file = Path(tokenizer_file)
    tokenizer = load_tokenizer(tokenizer_file)
    ChatTokenIds.of(tokenizer)  # a tokenizer from before the chat format: say so before any work
    spec = {**chat_cache_spec(cfg, tokenizer_file, block_size), "format_version": FORMAT_VERSION}

    def build(temp: Path) -> dict[str, Any]:
        pairs = load_preferences(cfg, progress=progress)
        splits, stats = {}, {}
        for name, rows in (("train", pairs.train), ("val", pairs.val)):
            splits[name], stats[name] = tokenize_pairs(tokenizer, rows, block_size)
            if len(splits[name]) == 0:
                raise DataError(
                    f"no {'training' if name == 'train' else 'held-out'} reply pair fits in model.block_size "
                    f"{block_size} ({pairs.description}); the first: {_first_too_long(tokenizer, rows, block_size)}"
                )
        arrays = {f"{name}_{side}": getattr(split, side) for name, split in splits.items() for side in _SIDES}
        return {
            **spec,
            "description": pairs.description,
            "val_from": pairs.val_from,
            "eot_id": eot_id(tokenizer),
            "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
            "splits": stats,
            "conversations_sha256": write_splits(temp, arrays),
        }

    return cache.open_or_build(
        cache.entry_path(cfg.cache_dir, f"preference-{cfg.source}", spec),
        open_entry=lambda entry: PreparedPreferences.open(entry, tokenizer_file), build=build,
        totals=_totals, is_main=is_main, progress=progress, wait_timeout_s=wait_timeout_s,
    )


def _totals(meta: dict[str, Any]) -> str:
    return "; ".join(
        f"{name} {s['pairs']:,} reply pairs ({s['cut']:,} with the prompt cut to the window, {s['dropped']:,} dropped)"
        for name, s in meta["splits"].items()
    )
