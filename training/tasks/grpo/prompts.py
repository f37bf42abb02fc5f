"""Questions for an RL run, rendered as chat prompts with the parent run's tokenizer: the arithmetic
task's ("What is 23+58?") and the calculator task's (``data.sources.tool_arithmetic``). Nothing is
cached: the problems are made from their seed in a moment. A prompt is the question with the
generation prompt (``<|user|>What is 2+3?<|end|><|assistant|>``); the row data is what a reward
checks the reply against. The calculator task's prompts are every exchange of its conversations
after the exchanges before it, the plays' speeches among them (``needs_tool`` False), the oldest
exchanges dropped as a chat drops them (``data.chat.fit_chat``) where that leaves a whole reply room
in the window: a reply cut short there would reward shorter calls, not right ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import DataError
from data.chat import ChatTooLong, Message, fit_chat, render_chat
from data.config import CalculatorShapes
from data.prepared import cache
from data.sources.arithmetic import problems
from data.sources.tool_arithmetic import calculator_chats
from data.tokenizer import eot_id, load_tokenizer


@dataclass
class PromptSplit:
    prompts: list[list[int]]  # token ids, each ending in <|assistant|>
    questions: list[str]
    rows: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass
class PreparedPrompts(cache.TokenizerMixin):
    tokenizer_path: Path
    train: PromptSplit
    val: PromptSplit
    meta: dict[str, Any] = field(default_factory=dict)

    def check_block_size(self, block_size: int) -> None:
        longest = max(len(p) for split in (self.train, self.val) for p in split.prompts)
        if longest >= block_size:
            raise DataError(f"the longest rl prompt has {longest} tokens, leaving no room for a reply in "
                            f"model.block_size {block_size}; use shorter questions")


# A prompt's messages (the last one the question) and the row a reply to it is checked against.
Item = tuple[list[Message], dict[str, Any]]


def _split(tokenizer: Any, items: list[Item], window: int | None, reply: int) -> PromptSplit:
    split = PromptSplit([], [], [])
    for messages, row in items:
        try:
            ids = (render_chat(tokenizer, messages, add_generation_prompt=True) if window is None else fit_chat(
                tokenizer, messages, window - 1, add_generation_prompt=True, min_tokens=window - max(reply, 1)).chat).ids
        except ChatTooLong:  # a speech longer than the window: no room for a reply
            continue
        split.prompts.append(ids)
        split.questions.append(messages[-1].content)
        split.rows.append(row)
    return split


def _prepared(tokenizer_file: Path, train: list[Item], val: list[Item], window: int | None = None,
              reply: int = 0) -> PreparedPrompts:
    tokenizer = load_tokenizer(tokenizer_file)
    meta = {"eot_id": eot_id(tokenizer), "vocab_size": tokenizer.get_vocab_size()}
    return PreparedPrompts(Path(tokenizer_file), _split(tokenizer, train, window, reply),
                           _split(tokenizer, val, window, reply), meta)


def prepare_arithmetic_prompts(tokenizer_file: Path, *, seed: int, train_problems: int, val_problems: int,
                               max_operand: int, operations: str) -> PreparedPrompts:
    """The arithmetic task's held-out and training prompts (data.sources.arithmetic): the first
    ``val_problems`` held out, the rest to train on."""
    items = [([Message("user", p.question)], p.row())
             for p in problems(seed, val_problems + train_problems, max_operand, operations)]
    return _prepared(tokenizer_file, items[val_problems:], items[:val_problems])


def prepare_calculator_prompts(tokenizer_file: Path, cfg: CalculatorShapes, *, train_problems: int, val_problems: int,
                               val_fraction: float, split_seed: int, window: int, reply: int) -> PreparedPrompts:
    """The calculator task's held-out and training prompts (data.sources.tool_arithmetic), drawn as
    ``data.calculator`` draws its conversations from the same settings; ``reply`` tokens of the
    ``window`` left for the reply where dropping old exchanges allows."""
    train, val = calculator_chats(cfg, val_problems + train_problems, val_problems, val_fraction, split_seed)
    return _prepared(tokenizer_file, [p for c in train for p in c.prompts()], [p for c in val for p in c.prompts()],
                     window, reply)
