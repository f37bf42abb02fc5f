"""The tool lab's measures of what a user meets, with scripted chats standing in for the model: each
held-out question is asked in its place in a conversation that goes on after every answer, passes on
its own problem's answer alone, and counts in its turn and in each of its shapes; a plays prompt whose
reply calls, even a call that does not parse, counts as calling."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from benchmarks.tool_lab import asked_in_conversations, calling_share, share_by


@dataclass(frozen=True)
class Problem:
    question: str
    answer: str
    shapes: tuple[str, ...] = ()


PROBLEMS = [Problem(f"What is {n}*3?", str(3 * n), ("1-digit" if n < 10 else "2-digit", "*")) for n in range(4, 15)]


@dataclass
class Scripted:
    """A chat that answers each question right, except at the turns in ``wrong`` (counted in this
    conversation), where it gives the previous question's answer, as a model that lost track would."""

    wrong: set[int]
    heard: list[str] = field(default_factory=list)

    def reply(self, text: str) -> SimpleNamespace:
        self.heard.append(text)
        problem = next(p for p in PROBLEMS if p.question == text)
        previous = PROBLEMS[PROBLEMS.index(problem) - 1]
        answer = previous.answer if len(self.heard) in self.wrong else problem.answer
        return SimpleNamespace(text=f"{answer}\n", steps=[], finish_reason="end")


def test_each_question_is_asked_in_its_place_in_one_conversation_and_scored_on_its_own_answer():
    sessions = [Scripted({3}), Scripted({3, 5})]
    handed = iter(sessions)
    asked = asked_in_conversations(lambda: next(handed), PROBLEMS)  # 11 problems: two whole conversations
    assert [s.heard for s in sessions] == [[p.question for p in PROBLEMS[:5]], [p.question for p in PROBLEMS[5:10]]]
    assert [(turn, problem) for turn, problem, _ in asked] == list(zip([1, 2, 3, 4, 5] * 2, PROBLEMS[:10]))
    assert [passed for *_, passed in asked] == [True, True, False, True, True, True, True, False, True, False]
    assert share_by(asked, lambda turn, _: [turn]) == {"1": 1.0, "2": 1.0, "3": 0.0, "4": 1.0, "5": 0.5}


def test_a_question_counts_in_every_shape_group_it_has():
    asked = [(1, PROBLEMS[0], True), (2, PROBLEMS[5], False), (3, PROBLEMS[6], True), (4, PROBLEMS[7], True)]
    assert share_by(asked, lambda _, problem: problem.shapes) == {"*": 0.75, "1-digit": 0.5, "2-digit": 1.0}


@pytest.mark.parametrize("calls, share", [(["none", "none", "none", "none"], 0.0),
                                          (["called", "none", "malformed", "none"], 0.5),
                                          (["called", "called", "called", "malformed"], 1.0)])
def test_a_plays_prompt_whose_reply_calls_counts_and_a_malformed_call_counts_too(calls, share):
    systems: list[str | None] = []

    class Plays:
        def __init__(self, system: str | None) -> None:
            systems.append(system)

        def reply(self, speech: str) -> SimpleNamespace:
            kind = calls[int(speech)]
            return SimpleNamespace(text="", steps=["a call"] if kind == "called" else [],
                                   finish_reason="malformed call" if kind == "malformed" else "end")

    prompts = [(f"You are speaker {i}.", str(i)) for i in range(len(calls))]
    assert calling_share(Plays, prompts) == share
    assert systems == [system for system, _ in prompts]  # each prompt a chat of its own, under its system prompt
