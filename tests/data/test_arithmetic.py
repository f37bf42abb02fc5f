"""The arithmetic questions of RL runs: deterministic from the seed, distinct, answered right."""

from __future__ import annotations

import pytest

from data.sources.arithmetic import OPERATIONS, conversations, problems


def test_problems_follow_from_the_seed_are_distinct_and_answered_right():
    items = problems(3, 150, max_operand=12, operations="+-*")
    assert items == problems(3, 150, max_operand=12, operations="+-*")
    assert items != problems(4, 150, max_operand=12, operations="+-*")
    assert len({p.question for p in items}) == 150
    for p in items:
        a, op, b = next((p.question[8:-1].partition(op) for op in OPERATIONS if op in p.question[8:-1]))
        assert p.question == f"What is {a}{op}{b}?" and int(p.answer) == OPERATIONS[op](int(a), int(b))
    # A longer list begins with the shorter one: the held-out questions stay held out as it grows.
    assert problems(3, 160, max_operand=12, operations="+-*")[:150] == items


def test_more_problems_than_exist_are_refused():
    with pytest.raises(ValueError, match="only 16 distinct problems exist"):
        problems(0, 17, max_operand=3, operations="+")


def test_conversations_answer_each_question():
    rows = conversations(problems(0, 2, max_operand=3, operations="+"))
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant"]
    assert rows[0]["messages"][1]["content"] == problems(0, 1, max_operand=3, operations="+")[0].answer
