"""Reward functions for RL runs (``data.format: rl``): plain Python, chosen by name in ``rl.rewards``.

A reward function takes the prompt's text (the user's question), the completion's text (the
model's reply, without its end token) and the row's data (for the arithmetic task:
``{"question": ..., "answer": ...}``), and returns a float. A run adds the rewards of every
function it names; each one's mean is logged as ``rewards/<name>/mean``, as TRL does.

Adding one, in a module of your own (say ``my_rewards.py`` beside ``train.py``)::

    def short(prompt: str, completion: str, row: dict) -> float:
        \"\"\"1 for a reply of at most 4 characters: a nudge towards bare answers.\"\"\"
        return 1.0 if len(completion) <= 4 else 0.0

and name it ``my_rewards:short`` in the config (``rl.rewards: [correct, "my_rewards:short"]``).
A name without a colon is one of ``BUILT_IN``'s.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Callable

RewardFunction = Callable[[str, str, dict[str, Any]], float]

_INTEGER = re.compile(r"-?\d+")


def correct(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """1 when the reply is exactly the answer (surrounding spaces aside), else 0: the check that
    held-out pass@k counts."""
    return 1.0 if completion.strip() == row["answer"] else 0.0


def integer_format(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """1 when the reply is a bare integer, right or wrong: a format reward."""
    return 1.0 if _INTEGER.fullmatch(completion.strip()) else 0.0


def closeness(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """A partial credit: 1 / (1 + |reply - answer|) for an integer reply, 0 otherwise."""
    text = completion.strip()
    if not _INTEGER.fullmatch(text):
        return 0.0
    return 1.0 / (1.0 + abs(int(text) - int(row["answer"])))


BUILT_IN: dict[str, RewardFunction] = {"correct": correct, "integer_format": integer_format, "closeness": closeness}


def reward_function(name: str) -> RewardFunction:
    """The function ``name`` means: a built-in one, or ``module:function`` imported. Raises
    ValueError with a one-line message naming the problem."""
    if ":" not in name:
        if name not in BUILT_IN:
            raise ValueError(f"unknown reward {name!r}: use one of {', '.join(BUILT_IN)} or module:function")
        return BUILT_IN[name]
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward {name!r}: cannot import {module_name} ({e})") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ValueError(f"reward {name!r}: {module_name} has no function {attribute!r}")
    return function
