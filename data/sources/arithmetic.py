"""Arithmetic questions with checkable answers: the prompts of an RL run (``data.format: rl``).

Each problem is a question such as "What is 23+58?" and its answer "81". Problems are drawn without
repeats from the operand pairs in ``0..max_operand``, never listing them all (operands up to 10^12
cost what 99 does); the held-out ones come first, so none is a training one, and asking for more
only adds problems at the end. Everything follows from ``seed``. ``conversations`` turns problems
into chat rows, to fine-tune a base model that is then sometimes right: what RL starts from."""

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


# Up to this many pairs (about 100 MB listed), every pair is listed and shuffled, as runs did before
# larger spaces could be drawn, so those runs keep their questions and resume exactly.
LISTED_UP_TO = 1_000_000


def problems(seed: int, count: int, max_operand: int, operations: str) -> list[Problem]:
    """``count`` distinct problems, shuffled by ``seed``; refuses a count above what exists."""
    side = max_operand + 1
    total = len(operations) * side * side
    if count > total:
        raise ValueError(f"only {total} distinct problems exist for operands up to {max_operand} "
                         f"and operations {operations!r}; ask for fewer or raise max_operand")
    rng = random.Random(f"arithmetic-{seed}")
    if total <= LISTED_UP_TO:
        pairs = [(a, b, op) for op in operations for a in range(side) for b in range(side)]
        rng.shuffle(pairs)
        chosen = pairs[:count]
    else:
        chosen = [(index // side % side, index % side, operations[index // (side * side)])
                  for index in shuffled_prefix(rng, total, count)]
    return [Problem(f"What is {a}{op}{b}?", str(OPERATIONS[op](a, b))) for a, b, op in chosen]


def shuffled_prefix(rng: random.Random, n: int, k: int) -> list[int]:
    """The first ``k`` numbers of a uniformly random order of ``range(n)`` in O(k): Fisher-Yates from
    the front, keeping only the swapped places; a larger ``k`` from the same ``rng`` state extends them."""
    swapped: dict[int, int] = {}
    drawn = []
    for i in range(k):
        j = rng.randrange(i, n)
        drawn.append(swapped.get(j, j))
        swapped[j] = swapped.get(i, i)
    return drawn


def conversations(items: list[Problem]) -> list[dict[str, Any]]:
    """Chat rows (``data.sources.conversations``' shape) answering each problem."""
    return [{"id": f"arith-{i}", "messages": [{"role": "user", "content": p.question},
                                               {"role": "assistant", "content": p.answer}]}
            for i, p in enumerate(items)]
