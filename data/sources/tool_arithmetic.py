"""Conversations that call the calculator (``data.source: calculator``, ``data.format: chat``).

Each problem is an expression of 2 to ``max_terms`` operands of ``digits`` digits, joined by
``operations``; a conversation is the question, the call, the calculator's result, and the result as
the answer:

    user: What is 347*812-95?
    assistant: <|call|>calculator{"expression":"347*812-95"}
    tool: 281669
    assistant: 281669

The result is what ``tools.calculator`` returns, so training shows exactly what the model reads when
it calls; the arguments are compact JSON, the fewest tokens. Problems are distinct and the held-out
ones are drawn first, so none is a training one; everything follows from ``seed``. The same problems
with their answers (``tool_problems``) are GRPO's prompts with the calculator (``rl.task: calculator``).
"""

from __future__ import annotations

import json
import random
from typing import Any

from data.chat import Message, ToolCall
from data.config import CalculatorSourceConfig
from data.sources.arithmetic import Problem
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


def question(expression: str) -> str:
    """The user's question about ``expression``."""
    return f"What is {expression}?"


def tool_problems(cfg: CalculatorSourceConfig, count: int) -> list[Problem]:
    """``count`` questions and their answers (the calculator's result), in the order drawn: the
    prompts of an RL run with the calculator (``training.tasks.grpo.prompts``)."""
    return [Problem(question(e), calculator(e)) for e in expressions(cfg, count)]


def conversation(expression: str) -> list[Message]:
    """The question, the call, the calculator's result and the answer."""
    result = calculator(expression)
    arguments = json.dumps({"expression": expression}, separators=(",", ":"))
    return [Message("user", question(expression)),
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
