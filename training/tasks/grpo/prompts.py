"""Questions for an RL run, rendered as chat prompts with the parent run's tokenizer: the arithmetic
task's ("What is 23+58?") and the calculator task's (``data.sources.tool_arithmetic``). Nothing is
cached: the problems are made from their seed in a moment. A prompt is the question with the
generation prompt (``<|user|>What is 2+3?<|end|><|assistant|>``); the row data is what a reward
checks the reply against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import DataError
from data.chat import Message, render_chat
from data.config import CalculatorSourceConfig
from data.prepared import cache
from data.sources.arithmetic import Problem, problems
from data.sources.tool_arithmetic import tool_problems
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


def _split(tokenizer: Any, items: list[Problem]) -> PromptSplit:
    prompts = [render_chat(tokenizer, [Message("user", p.question)], add_generation_prompt=True).ids for p in items]
    return PromptSplit(prompts, [p.question for p in items], [p.row() for p in items])


def _prepared(tokenizer_file: Path, items: list[Problem], val_problems: int) -> PreparedPrompts:
    """The first ``val_problems`` of ``items`` held out, the rest to train on."""
    tokenizer = load_tokenizer(tokenizer_file)
    meta = {"eot_id": eot_id(tokenizer), "vocab_size": tokenizer.get_vocab_size()}
    return PreparedPrompts(Path(tokenizer_file), _split(tokenizer, items[val_problems:]),
                           _split(tokenizer, items[:val_problems]), meta)


def prepare_arithmetic_prompts(tokenizer_file: Path, *, seed: int, train_problems: int, val_problems: int,
                               max_operand: int, operations: str) -> PreparedPrompts:
    """The arithmetic task's held-out and training prompts (data.sources.arithmetic)."""
    return _prepared(tokenizer_file, problems(seed, val_problems + train_problems, max_operand, operations),
                     val_problems)


def prepare_calculator_prompts(tokenizer_file: Path, *, seed: int, train_problems: int, val_problems: int,
                               digits: int, operations: str, max_terms: int) -> PreparedPrompts:
    """The calculator task's held-out and training prompts (data.sources.tool_arithmetic), drawn as
    ``data.calculator`` draws its conversations from the same settings."""
    source = CalculatorSourceConfig(seed=seed, conversations=val_problems + train_problems, digits=digits,
                                    operations=operations, max_terms=max_terms)
    return _prepared(tokenizer_file, tool_problems(source, source.conversations), val_problems)
