"""Tools that misbehave on purpose, for the toolbox tests. A plain module the worker imports by
``tool_testkit:<name>`` (pytest puts this folder on the path, and the worker inherits the path)."""

import os
import subprocess
import sys
import time


def add(a: int, b: int = 1) -> int:
    """Add two integers.

    The second paragraph is not part of the description."""
    return a + b


def fails(text: str) -> str:
    """Always raises."""
    raise RuntimeError(f"broken on {text}")


def hangs(seconds: float) -> str:
    """Sleeps far past any limit."""
    time.sleep(seconds)
    return "woke up"


def spins() -> str:
    """A pure-Python loop that never ends: no sleep to interrupt."""
    while True:
        pass


def hangs_with_a_child(path: str) -> str:
    """Starts a long-lived child process (writing its pid to ``path``), then hangs."""
    child = subprocess.Popen(["sleep", "600"])
    with open(path, "w", encoding="utf-8") as f:
        f.write(str(child.pid))
    time.sleep(600)
    return "never"


def exits(code: int) -> str:
    """Calls sys.exit."""
    sys.exit(code)


def crashes() -> str:
    """Ends its process at once, with no cleanup."""
    os._exit(7)


def closes_pipes() -> str:
    """Closes every descriptor but stdin, stdout and stderr: the worker's own pipes among them."""
    os.closerange(3, 256)
    return "closed"


def chatty(text: str) -> str:
    """Prints to stdout and reads stdin before answering: neither may break the exchange."""
    print("noise on stdout", flush=True)
    os.write(1, b"raw noise\n")
    return f"read {sys.stdin.read()!r}, said {text}"


def huge(size: int) -> str:
    """Returns ``size`` characters."""
    return "x" * size


def structured(flag: bool) -> dict:
    """Returns a mapping, which the model reads as JSON."""
    return {"flag": flag, "items": [1, 2]}


def surrogate() -> str:
    """Returns text no UTF-8 can carry."""
    return "a\ud800b"


def calculator_refusal(expression: str) -> dict:
    """The calculator's refusal of ``expression`` (None if it answers) and the most memory it
    allocated meanwhile, measured in the worker, whose time limit stops a regression that hangs."""
    import tracemalloc

    from tools.calculator import CalculatorError, calculator

    tracemalloc.start()
    try:
        calculator(expression)
        refusal = None
    except CalculatorError as error:
        refusal = str(error)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"refusal": refusal, "peak": peak}


def calculator_fuzz(seed: int, count: int) -> list:
    """Random strings of arithmetic's characters: those the calculator neither answers nor refuses
    with a CalculatorError (an uncaught error of another kind), as [expression, error] pairs."""
    import random

    from tools.calculator import CalculatorError, calculator

    rng = random.Random(seed)
    alphabet = "0123456789" * 3 + "+-*/" * 3 + "()" * 2 + ".e^ _xj"
    escaped = []
    for _ in range(count):
        expression = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        expression = expression.replace("^", "**")
        try:
            calculator(expression)
        except CalculatorError:
            pass
        except Exception as error:  # noqa: BLE001 - what the test looks for
            escaped.append([expression, f"{type(error).__name__}: {error}"])
    return escaped
