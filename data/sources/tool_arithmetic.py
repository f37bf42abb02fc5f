"""Conversations that call the calculator (``data.source: calculator``, ``data.format: chat``):
arithmetic a small model cannot do in its head, answered by calling the built-in calculator and
then reading its result back.

Each problem is an expression of ``terms`` operands (2 to ``max_terms``, each with ``digits``
digits), joined by operations drawn from ``operations``: three-digit products by default, or
short chains such as ``347*812-95``. A conversation is the question, the assistant's call with the
expression as its argument, the calculator's result, and the result as the answer:

    user: What is 347*812-95?
    assistant: <|call|>calculator{"expression":"347*812-95"}
    tool: 281669
    assistant: 281669

so what is learned is to copy the question into the call, and the result into the answer. The
result is what ``tools.calculator`` itself returns, so training shows the model exactly what it
reads when it calls. The arguments are compact JSON (no spaces): the fewest tokens, and JSON
still, verbatim (``data.chat``).

Problems are distinct; the held-out ones (``val_fraction`` of them) are drawn first, so no held-out
question is ever a training one. Everything follows from ``seed``; nothing is read.
"""

from __future__ import annotations

import json
import random
from typing import Any

from data.chat import Message, ToolCall
from data.config import CalculatorSourceConfig
from tools.calculator import CalculatorError, calculator

# Bump when the generator below changes, so cached conversations made by the old one are rebuilt.
GENERATOR_VERSION = 1
TOOL_NAME = "calculator"


def expressions(cfg: CalculatorSourceConfig, count: int) -> list[str]:
    """``count`` distinct expressions the calculator answers, in the order drawn from ``cfg.seed``."""
    rng = random.Random(f"calculator-{cfg.seed}")
    low, high = 10 ** (cfg.digits - 1) if cfg.digits > 1 else 0, 10**cfg.digits - 1
    drawn: dict[str, None] = {}
    attempts = 0
    while len(drawn) < count:
        attempts += 1
        if attempts > 20 * count + 1000:  # CalculatorSourceConfig bounds count by what exists; a safety net
            raise ValueError(f"could not draw {count} distinct expressions from data.calculator's settings")
        terms = rng.randint(2, cfg.max_terms)
        numbers = [str(rng.randint(low, high)) for _ in range(terms)]
        operations = [rng.choice(cfg.operations) for _ in range(terms - 1)]
        expression = numbers[0] + "".join(op + number for op, number in zip(operations, numbers[1:]))
        try:
            calculator(expression)
        except CalculatorError:  # a chain past the calculator's bounds: draw another
            continue
        drawn[expression] = None
    return list(drawn)


def conversation(expression: str) -> list[Message]:
    """The question, the call, the calculator's result and the answer."""
    result = calculator(expression)
    arguments = json.dumps({"expression": expression}, separators=(",", ":"))
    return [Message("user", f"What is {expression}?"),
            Message("assistant", "", (ToolCall(TOOL_NAME, arguments),)),
            Message("tool", result),
            Message("assistant", result)]


def calculator_conversations(cfg: CalculatorSourceConfig, val_fraction: float
                             ) -> tuple[list[list[Message]], list[list[Message]]]:
    """Training and held-out conversations: ``cfg.conversations`` in all, the held-out share first."""
    drawn = expressions(cfg, cfg.conversations)
    held_out = max(1, round(val_fraction * cfg.conversations))
    return [conversation(e) for e in drawn[held_out:]], [conversation(e) for e in drawn[:held_out]]


def calculator_spec(cfg: CalculatorSourceConfig) -> dict[str, Any]:
    """What decides the conversations, for the cache key."""
    return {"type": "calculator-chat", "version": GENERATOR_VERSION, **vars(cfg)}
