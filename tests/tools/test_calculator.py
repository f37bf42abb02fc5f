"""The built-in calculator: exact arithmetic on a small grammar, and hostile expressions refused
before the work they would cost, checked by the memory each refusal allocates, in a toolbox's worker
whose time limit turns a regression into a failure rather than a hung test."""

import builtins
import json

import pytest

from tools import Toolbox, load_tools
from tools.calculator import MAX_EXPONENT, MAX_EXPRESSION_CHARS, calculator


@pytest.mark.parametrize("expression, value", [
    ("347*812", "281764"),
    ("347*812-95", "281669"),
    (" 12 + 30 ", "42"),
    ("-(3+4)*2", "-14"),
    ("--5", "5"),
    ("2**10", "1024"),
    ("2**-2", "0.25"),
    ("1e14**-64", "0"),  # too small to tell from 0, not an overflow
    ("(-3)**3", "-27"),
    ("7/2", "3.5"),
    ("6/3", "2"),
    ("1/3", "0.333333333333"),
    ("1.5*4", "6"),
    ("999999*999999", "999998000001"),
    ("((((1+2))))*3", "9"),
    ("(" * 90 + "1" + ")" * 90, "1"),  # parentheses alone nest nothing
    # The bounds themselves (each one step past is in HOSTILE); whitespace counts towards the length.
    (f"1**{MAX_EXPONENT}", "1"),
    (f"1**-{MAX_EXPONENT}", "1"),
    (" " * (MAX_EXPRESSION_CHARS - 1) + "1", "1"),
])
def test_arithmetic_is_exact(expression, value):
    assert calculator(expression) == value


HOSTILE = [
    ("9**9**9", "exponent must be a whole number"),
    ("10**10**10", "exponent must be a whole number"),
    ("999999999999999*999999999999999*999999999999999", "too large"),
    ("2**64*2**64", "too large"),
    ("1e14**64", "is too large"),  # a float power past the float range is refused, not overflowed
    ("1e308*10", "too large"),
    ("99999999999999999", "too large"),
    ("(-" * 66 + "1" + ")" * 66, "nests deeper"),
    ("-" * 150 + "1", "nests deeper"),
    ("1+" * 99 + "1", "nests deeper"),
    ("x", "the name 'x'"),
    ("__import__('os').system('true')", "function call"),
    ("(1).__class__", "attribute"),
    ("abs(-1)", "function call"),
    ("lambda: 1", "Lambda"),
    ("[i for i in range(10**9)]", "ListComp"),
    ("'a'*10**9", "is not a number"),
    ("'1'", "is not a number"),
    ("True+1", "is not a number"),
    ("1j", "is not a number"),
    ("2^8", "use ** for powers"),
    ("7//2", "use / to divide"),
    ("1<2", "Compare"),
    ("+1", "UAdd"),
    ("1/0", "division by zero"),
    ("0**-1", "division by zero"),
    ("2**0.5", "exponent must be a whole number"),
    ("1+", "not an arithmetic expression"),
    ("", "empty"),
    (f"1**{MAX_EXPONENT + 1}", "exponent must be a whole number"),
    (f"1**-{MAX_EXPONENT + 1}", "exponent must be a whole number"),
    (" " * MAX_EXPRESSION_CHARS + "1", "characters, over the limit"),
    ("9" * 50_000, "characters, over the limit"),
]


@pytest.fixture(scope="module")
def worker():  # a regression that computed a refused power would hang; in a worker it times out
    tools = load_tools(["tool_testkit:calculator_refusal", "tool_testkit:calculator_fuzz", "calculator"])
    with Toolbox(tools, timeout_s=120) as toolbox:
        yield toolbox


@pytest.mark.parametrize("expression, fragment", HOSTILE, ids=lambda v: str(v)[:24])
def test_hostile_expressions_are_refused_with_a_reason_in_little_memory(worker, expression, fragment):
    result = worker.run("calculator_refusal", json.dumps({"expression": expression}))
    assert result.ok, result.text
    measured = json.loads(result.text)
    assert measured["refusal"] is not None and fragment in measured["refusal"], measured
    assert "\n" not in measured["refusal"]
    # Nothing the size of the refused work was ever built (parsing a 200-character expression is
    # the largest thing allocated).
    assert measured["peak"] < 2_000_000, measured


def test_the_calculator_tool_gives_its_refusals_to_the_model(worker):
    for expression, fragment in HOSTILE[:4]:
        result = worker.run("calculator", json.dumps({"expression": expression}))
        assert not result.ok and result.text.startswith("error: CalculatorError: ") and fragment in result.text


def test_eval_is_never_called(monkeypatch):
    monkeypatch.setattr(builtins, "eval", lambda *a, **k: pytest.fail("eval was called"))
    monkeypatch.setattr(builtins, "exec", lambda *a, **k: pytest.fail("exec was called"))
    assert calculator("2*(3+4)") == "14"


def test_random_strings_are_answered_or_refused_never_anything_else(worker):
    result = worker.run("calculator_fuzz", json.dumps({"seed": 0, "count": 20000}))
    assert result.ok and json.loads(result.text) == [], result.text
