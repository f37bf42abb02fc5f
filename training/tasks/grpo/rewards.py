"""Reward functions for RL runs (``data.format: rl``): plain Python, chosen by name in ``rl.rewards``.

A reward takes the prompt's text, the completion's text (without its end token) and the row's data
(``{"question": ..., "answer": ...}`` for the arithmetic and calculator tasks; the calculator task's
rows say ``needs_tool``, False for the plays' speeches, which have no answer), and returns a float.
With tools (``rl.tools``) the completion is the whole reply as the chat format renders it, calls and
results included; ``tool_answer_correct`` scores its answer, ``tool_format`` its calls (both 0 where no
tool is needed) and ``tool_when_needed`` whether it called exactly where one is, while the bare-answer
rewards are refused (``BARE_ANSWER``). A run adds the rewards it names and logs each
one's mean as ``rewards/<name>/mean``, as TRL does.

Adding one, in a module of your own (say ``my_rewards.py`` beside ``train.py``)::

    def short(prompt: str, completion: str, row: dict) -> float:
        \"\"\"1 for a reply of at most 4 characters: a nudge towards bare answers.\"\"\"
        return 1.0 if len(completion) <= 4 else 0.0

and name it ``my_rewards:short`` (``rl.rewards: [correct, "my_rewards:short"]``); a name without a
colon is one of ``BUILT_IN``'s. A user's function is checked when the config is read, and each value
it returns must be a finite number within ``MAX_REWARD``. Whatever it raises, ``SystemExit``
included, becomes a one-line ``RewardError``; ``KeyboardInterrupt`` is left alone.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Any, Callable

from common.errors import UserError, one_line
from data.chat import CALL, END_OF_TURN, ROLE_TOKENS
from tools.toolbox import ERROR_PREFIX

RewardFunction = Callable[[str, str, dict[str, Any]], float]

# The largest reward (in magnitude) a function may return. The advantages do not depend on the
# rewards' scale (each is divided by its group's deviation), but the deviation is computed in fp32:
# squares of rewards past about 1e19 overflow it, and at 1e6 fp32 still tells two rewards 0.1 apart.
# Rewards are scores (the built-in ones 0 to 1), so anything larger is a bug in the function.
MAX_REWARD = 1e6
_SHOWN = 80  # characters of a question, reply or returned value a message quotes

_INTEGER = re.compile(r"-?\d+")


class RewardError(UserError):
    """A reward function that cannot be imported or called, or that failed on a reply."""


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


def final_answer(completion: str) -> str:
    """A reply's answer: its last assistant turn (the text after the tools' results, when it called
    any; the whole reply when it did not)."""
    return completion.rpartition(ROLE_TOKENS["assistant"])[2]


def needs_tool(row: dict[str, Any]) -> bool:
    """Whether the row's question needs a tool: every arithmetic question, no speech of the plays."""
    return row.get("needs_tool", True)


def tool_when_needed(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """1 when the reply calls a tool exactly when its question needs one, else 0: a call where none
    is needed costs as much as a missing one."""
    return 1.0 if (CALL in completion) == needs_tool(row) else 0.0


def tool_answer_correct(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """1 when the reply's answer, after any calls, is exactly the answer (surrounding spaces aside),
    else 0 (and 0 where no tool is needed): ``correct`` for a reply with tools, what held-out pass@k counts."""
    answer = final_answer(completion)
    return 1.0 if needs_tool(row) and CALL not in answer and answer.strip() == row["answer"] else 0.0


def tool_format(prompt: str, completion: str, row: dict[str, Any]) -> float:
    """A format reward: 1 when the reply called a tool, every call got a result that is not an
    error (a call that does not parse gets none), and an answer follows, right or wrong; else 0
    (and 0 where no tool is needed)."""
    *calling, answer = completion.split(ROLE_TOKENS["assistant"])
    if not needs_tool(row) or not calling or CALL in answer or not answer.strip():
        return 0.0
    for turn in calling:
        said, *results = turn.split(ROLE_TOKENS["tool"])
        if not results or said.count(CALL) != len(results) or \
                any(result.startswith(ERROR_PREFIX) or not result.endswith(END_OF_TURN) for result in results):
            return 0.0
    return 1.0


BUILT_IN: dict[str, RewardFunction] = {"correct": correct, "integer_format": integer_format, "closeness": closeness,
                                       "tool_answer_correct": tool_answer_correct, "tool_format": tool_format,
                                       "tool_when_needed": tool_when_needed}
# The built-in rewards that read the completion as a bare answer: with tools it holds the calls too.
BARE_ANSWER = ("correct", "integer_format", "closeness")


@dataclass(frozen=True)
class Reward:
    """A reward function under the name the config gives it, whose every score is checked."""

    name: str
    function: RewardFunction

    def __call__(self, prompt: str, completion: str, row: dict[str, Any]) -> float:
        """The function's score of ``completion``, a finite float; a RewardError naming the reward and
        the question otherwise."""
        where = f"for the question {_shown(prompt)} (reply {_shown(completion)})"
        try:
            value = self.function(prompt, completion, row)
        except (Exception, SystemExit) as e:  # SystemExit: a sys.exit() in the user's code
            raise RewardError(f"reward {self.name!r} {_raised(e)} {where}; fix the function") from None
        score = _as_float(value)
        if score is None or not -MAX_REWARD <= score <= MAX_REWARD:  # NaN fails both comparisons
            raise RewardError(f"reward {self.name!r} returned {_shown(value)} {where}; a reward must return a "
                              f"finite number from {-MAX_REWARD:g} to {MAX_REWARD:g}")
        return score


def reward_function(name: str) -> Reward:
    """The reward ``name`` means: a built-in one, or ``module:function`` imported and checked to be a
    function of (prompt, completion, row). Raises RewardError with a one-line message."""
    if ":" not in name:
        if name not in BUILT_IN:
            raise RewardError(f"unknown reward {name!r}: use one of {', '.join(BUILT_IN)} or module:function")
        return Reward(name, BUILT_IN[name])
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise RewardError(f"reward {name!r}: there is no module {e.name or module_name!r}; put {module_name}.py "
                          "beside train.py or on PYTHONPATH") from None
    except (Exception, SystemExit) as e:  # a syntax error, or an error (or exit) while the module runs
        raise RewardError(f"reward {name!r}: importing {module_name} {_raised(e)}; fix the module") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise RewardError(f"reward {name!r}: {module_name} has no function {attribute!r}")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a callable whose signature cannot be read: its calls are checked
        signature = None
    if signature is not None:
        try:
            signature.bind("prompt", "completion", {})
        except TypeError as e:
            raise RewardError(f"reward {name!r}: {attribute}{signature} cannot be called as (prompt, completion, "
                              f"row) ({e}); give it those three arguments") from None
    return Reward(name, function)


def _as_float(value: Any) -> float | None:
    """``value`` as a float when it is a number (a bool, a numpy or one-element torch scalar too)."""
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):  # a tensor of several values, say
        return None


def _raised(error: BaseException) -> str:
    if isinstance(error, SystemExit):
        return f"called sys.exit({error.code!r})"
    if isinstance(error, SyntaxError):
        return f"failed: {error.msg} at {error.filename} line {error.lineno}"
    return f"raised {one_line(error, with_type=True)}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."
