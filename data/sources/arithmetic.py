"""Arithmetic questions with checkable answers: the prompts of an RL run (``data.format: rl``).

Each problem is a user question such as "What is 23+58?" and its answer "81", written as the
digits alone. Problems are drawn without repeats from every pair of operands in
``0..max_operand`` for each operation; the held-out problems come first in the shuffled list, so
no held-out question is ever a training one. Everything follows from ``seed``; nothing is read.

``conversations`` turns problems into chat rows (the question, then the answer as the
assistant's reply), for fine-tuning a base model that is then sometimes right: what RL needs to
start from.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class Problem:
    question: str  # the user's message
    answer: str  # the expected reply, digits (and a sign) only

    def row(self) -> dict[str, Any]:
        """The problem as a reward function's row data."""
        return {"question": self.question, "answer": self.answer}


def problems(seed: int, count: int, max_operand: int, operations: str) -> list[Problem]:
    """``count`` distinct problems, shuffled by ``seed``; refuses a count above what exists."""
    pairs = [(a, b, op) for op in operations for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if count > len(pairs):
        raise ValueError(f"only {len(pairs)} distinct problems exist for operands up to {max_operand} "
                         f"and operations {operations!r}; ask for fewer or raise max_operand")
    random.Random(f"arithmetic-{seed}").shuffle(pairs)
    return [Problem(f"What is {a}{op}{b}?", str(OPERATIONS[op](a, b))) for a, b, op in pairs[:count]]


def conversations(items: list[Problem]) -> list[dict[str, Any]]:
    """Chat rows (``data.sources.conversations``' shape) answering each problem."""
    return [{"id": f"arith-{i}", "messages": [{"role": "user", "content": p.question},
                                               {"role": "assistant", "content": p.answer}]}
            for i, p in enumerate(items)]
