"""Conversations that call the calculator (``data.source: calculator``, ``data.format: chat``), and the
same problems as GRPO's prompts with the calculator (``rl.task: calculator``).

A problem is 2 to ``max_terms`` operands of 1 to ``digits`` digits each, joined by ``operations``,
with ``parentheses`` around some of them; its question is one of several phrasings, some with the
operators as words. The call always carries the compact symbolic expression, and the result is what
``tools.calculator`` returns, so training shows exactly what the model reads when it calls:

    user: What is 12 times (7 plus 305)?
    assistant: <|call|>calculator{"expression":"12*(7+305)"}
    tool: 3744
    assistant: 3744

A conversation is 1 to ``max_exchanges`` such exchanges. A share ``plays_share`` of them hold one
of the plays' conversations too (``data.sources.shakespeare_chat``: its system prompt first, its
exchanges alone or among the questions), so the model learns to call only where a question needs
arithmetic, at any turn, and to answer a speech in character. Problems are distinct by expression and
the held-out ones are drawn first, so none is a training one; held-out conversations hold only the
plays held out as ``shakespeare_chat`` holds them out. Everything follows from ``seed``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from itertools import cycle
from typing import Any

from data.chat import Message, ToolCall
from data.config import CalculatorShapes, CalculatorSourceConfig
from data.sources.shakespeare import shakespeare_fingerprint
from data.sources.shakespeare_chat import CHAT_SET_VERSION, shakespeare_chat
from tools.calculator import CalculatorError, calculator

# Bump when the generator below changes, so cached conversations made by the old one are rebuilt.
GENERATOR_VERSION = 2
TOOL_NAME = "calculator"
WORDS = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}
PHRASINGS = ("What is {}?", "Compute {}.", "How much is {}?", "Calculate {}.", "What's {}?", "Work out {}.")
SHAPE_SHARE = 0.5  # of the problems that may have parentheses or words, those that do


@dataclass(frozen=True)
class ToolProblem:
    question: str  # what the user asks
    expression: str  # what the call carries
    answer: str  # calculator(expression)
    shapes: tuple[str, ...]  # its longest operand ("3-digit"), its operations, "parentheses", "words"

    def row(self) -> dict[str, Any]:
        """What a reward checks a reply against."""
        return {"question": self.question, "answer": self.answer, "needs_tool": True, "shapes": list(self.shapes)}


def _draw(rng: random.Random, cfg: CalculatorShapes) -> ToolProblem | None:
    """One problem, or None where the calculator refuses it (a division by zero, a product too large)."""
    terms = rng.randint(2, cfg.max_terms)
    sizes = [rng.randint(1, cfg.digits) for _ in range(terms)]
    numbers = [str(rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)) for d in sizes]
    ops = [rng.choice(cfg.operations) for _ in range(terms - 1)]
    opened = closed = -1
    if cfg.parentheses and terms > 2 and rng.random() < SHAPE_SHARE:  # around 2 to terms - 1 operands
        width = rng.randint(2, terms - 1)
        opened = rng.randint(0, terms - width)
        closed = opened + width - 1
    words = cfg.words and rng.random() < SHAPE_SHARE
    phrasing = rng.choice(PHRASINGS)

    def written(spelled: dict[str, str]) -> str:
        return "".join((spelled[ops[i - 1]] if i else "") + "(" * (i == opened) + n + ")" * (i == closed)
                       for i, n in enumerate(numbers))

    expression = written({op: op for op in ops})
    try:
        answer = calculator(expression)
    except CalculatorError:
        return None
    shapes = (f"{max(sizes)}-digit", *(op for op in "+-*/" if op in ops), *["parentheses"] * (opened >= 0),
              *["words"] * words)
    asked = written({op: f" {WORDS[op]} " for op in ops}) if words else expression
    return ToolProblem(phrasing.format(asked), expression, answer, shapes)


def tool_problems(cfg: CalculatorShapes, count: int) -> list[ToolProblem]:
    """``count`` problems distinct by expression, in the order drawn from ``cfg.seed``: the first are
    the held-out ones."""
    rng = random.Random(f"calculator-{cfg.seed}")
    drawn: dict[str, ToolProblem] = {}
    attempts = 0
    while len(drawn) < count:
        attempts += 1
        if attempts > 20 * count + 1000:  # the config bounds count by what exists; a safety net
            raise ValueError(f"could not draw {count} distinct expressions from data.calculator's settings")
        problem = _draw(rng, cfg)
        if problem is not None:
            drawn.setdefault(problem.expression, problem)
    return list(drawn.values())


def conversation(expression: str, question: str | None = None) -> list[Message]:
    """The question (by default "What is <expression>?"), the call, the calculator's result and the answer."""
    result = calculator(expression)
    arguments = json.dumps({"expression": expression}, separators=(",", ":"))
    return [Message("user", question or f"What is {expression}?"),
            Message("assistant", "", (ToolCall(TOOL_NAME, arguments),)),
            Message("tool", result),
            Message("assistant", result)]


# An exchange: its messages, and the row a reply to its question (the first message) is checked against.
Exchange = tuple[list[Message], dict[str, Any]]


@dataclass(frozen=True)
class Chat:
    """A conversation: the plays' system prompt where it holds their exchanges, then its exchanges."""

    system: list[Message]
    exchanges: list[Exchange]

    def messages(self) -> list[Message]:
        return [*self.system, *(m for messages, _ in self.exchanges for m in messages)]

    def prompts(self) -> list[tuple[list[Message], dict[str, Any]]]:
        """Each exchange's question after the conversation before it, with its row."""
        return [([*self.system, *(m for messages, _ in self.exchanges[:j] for m in messages), messages[0]], row)
                for j, (messages, row) in enumerate(self.exchanges)]


def _chats(cfg: CalculatorShapes, problems: list[ToolProblem], plays: list[list[Message]], rng: random.Random
           ) -> list[Chat]:
    """``problems`` in order, grouped into conversations, some of them holding a conversation of ``plays``."""
    plays = rng.sample(plays, len(plays))
    scenes = cycle(plays)
    chats, taken = [], 0
    while taken < len(problems):
        size = rng.randint(1, cfg.max_exchanges)
        system, spoken = [], []
        if plays and rng.random() < cfg.plays_share:
            head, *turns = next(scenes)
            system = [head]
            spoken = [(turns[i:i + 2], {"question": turns[i].content, "needs_tool": False})
                      for i in range(0, len(turns), 2)]
        asked = problems[taken:taken + max(0, size - len(spoken))]
        taken += len(asked)
        exchanges = [(conversation(p.expression, p.question), p.row()) for p in asked]
        at = rng.randint(0, len(exchanges))
        chats.append(Chat(system, exchanges[:at] + spoken + exchanges[at:]))
    return chats


def calculator_chats(cfg: CalculatorShapes, count: int, held_out: int, val_fraction: float, split_seed: int
                     ) -> tuple[list[Chat], list[Chat]]:
    """Training and held-out conversations of ``count`` problems, the first ``held_out`` held out; the
    plays' exchanges among them split as ``shakespeare_chat(val_fraction, split_seed)`` splits them."""
    problems = tool_problems(cfg, count)
    plays = shakespeare_chat(val_fraction, split_seed)[:2] if cfg.plays_share > 0 else ([], [])
    return (_chats(cfg, problems[held_out:], plays[0], random.Random(f"calculator-chats-{cfg.seed}-train")),
            _chats(cfg, problems[:held_out], plays[1], random.Random(f"calculator-chats-{cfg.seed}-val")))


def calculator_conversations(cfg: CalculatorSourceConfig, val_fraction: float, split_seed: int
                             ) -> tuple[list[list[Message]], list[list[Message]]]:
    """Training and held-out conversations: ``cfg.problems`` in all, the held-out share (at least one) first."""
    held_out = max(1, round(val_fraction * cfg.problems))
    train, val = calculator_chats(cfg, cfg.problems, held_out, val_fraction, split_seed)
    return [c.messages() for c in train], [c.messages() for c in val]


def calculator_spec(cfg: CalculatorSourceConfig) -> dict[str, Any]:
    """What decides the conversations, for the cache key (the split is the caller's)."""
    plays = {"plays": {"version": CHAT_SET_VERSION, **shakespeare_fingerprint()}} if cfg.plays_share > 0 else {}
    return {"type": "calculator-chat", "version": GENERATOR_VERSION, **vars(cfg), **plays}
