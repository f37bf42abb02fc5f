"""The arithmetic questions of RL runs: deterministic from the seed, distinct, answered right."""

import random
import tracemalloc
from collections import Counter

import pytest

from data.sources.arithmetic import OPERATIONS, conversations, problems, shuffled_prefix


def test_more_problems_than_exist_are_refused_and_conversations_answer_each_question():
    with pytest.raises(ValueError, match="only 16 distinct problems exist"):
        problems(0, 17, max_operand=3, operations="+")
    rows = conversations(problems(0, 2, max_operand=3, operations="+"))
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant"]
    assert rows[0]["messages"][1]["content"] == problems(0, 1, max_operand=3, operations="+")[0].answer


def test_a_small_space_keeps_the_draw_runs_have_always_had():
    # Every pair listed and shuffled by the seed's generator: the questions of runs made before large
    # spaces were drawn without listing them, so those runs resume exactly.
    pairs = [(a, b, op) for op in "+-" for a in range(13) for b in range(13)]
    random.Random("arithmetic-5").shuffle(pairs)
    expected = [f"What is {a}{op}{b}?" for a, b, op in pairs[:40]]
    assert [p.question for p in problems(5, 40, max_operand=12, operations="+-")] == expected


# A small space (169 pairs per operation, listed), and huge ones (10^10 pairs and up), drawn without listing them.
@pytest.mark.parametrize("count, max_operand", [(150, 12), (3000, 10**5), (3000, 10**12), (3000, 10**30)])
def test_problems_follow_from_the_seed_are_distinct_answered_right_and_never_list_a_huge_space(count, max_operand):
    tracemalloc.start()
    try:
        items = problems(7, count, max_operand=max_operand, operations="+-*")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20  # what the problems take, not what every pair would
    assert len({p.question for p in items}) == count and items == problems(7, count, max_operand, "+-*")
    for p in items:
        a, op, b = next((p.question[8:-1].partition(op) for op in OPERATIONS if op in p.question[8:-1][1:]))
        assert p.question == f"What is {a}{op}{b}?" and 0 <= int(a) <= max_operand and 0 <= int(b) <= max_operand
        assert int(p.answer) == OPERATIONS[op](int(a), int(b))
    assert max(int(p.question[8:].split("+")[0]) for p in items if "+" in p.question) > max_operand // 2
    # A longer list begins with the shorter one: the held-out questions stay held out as it grows.
    assert problems(7, count + 10, max_operand, "+-*")[:count] == items
    assert problems(8, count, max_operand, "+-*") != items


def test_the_prefix_of_a_shuffle_is_a_uniform_order_drawn_lazily():
    assert sorted(shuffled_prefix(random.Random(0), 50, 50)) == list(range(50))  # the whole order: a permutation
    first = Counter(shuffled_prefix(random.Random(seed), 4, 1)[0] for seed in range(4000))
    assert set(first) == {0, 1, 2, 3} and min(first.values()) > 850  # each place first about 1000 times in 4000
