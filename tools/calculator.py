"""The built-in ``calculator`` tool: arithmetic on numbers, evaluated safely.

The expression is parsed with ``ast`` and only numbers, ``+ - * /``, ``**`` with a small whole
exponent, parentheses and unary minus are walked; anything else is refused by name, and nothing is
handed to ``eval``. Every bound is checked before the work it limits, so a hostile expression costs
time and memory that do not depend on it: the text's length before parsing, the tree's depth before
walking, each number's size as read, and a power's size from its operands' logarithms before it is
computed (``9**9**9`` is refused at the outer exponent). Integers stay exact; a division gives a
decimal with 12 significant digits."""

import ast
import math

MAX_EXPRESSION_CHARS = 200
MAX_DEPTH = 32  # nested operations and parentheses
MAX_MAGNITUDE = 10**15  # every operand, intermediate and result lies strictly inside +- this
MAX_EXPONENT = 64
SIGNIFICANT_DIGITS = 12

DESCRIPTION = ("Evaluate an arithmetic expression exactly: numbers, + - * /, ** with a small whole "
               "exponent, parentheses and unary minus.")
PARAMETERS = {
    "type": "object",
    "properties": {"expression": {"type": "string", "description": "the expression, e.g. 347*812-95"}},
    "required": ["expression"],
}

_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
# What a refused operator most likely meant, for the message.
_HINTS = {ast.BitXor: "use ** for powers", ast.FloorDiv: "use / to divide", ast.Mod: "% is not supported"}

Number = int | float


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message names what is wrong in one line."""


def calculator(expression: str) -> str:
    """The value of ``expression`` as text (``CalculatorError`` for anything it refuses)."""
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be text, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is {len(expression)} characters, over the limit of "
                              f"{MAX_EXPRESSION_CHARS}")
    if not expression.strip():
        raise CalculatorError("the expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise CalculatorError(f"not an arithmetic expression: {expression.strip()!r}") from None
    if _depth(tree.body) > MAX_DEPTH:
        raise CalculatorError(f"the expression nests deeper than {MAX_DEPTH} levels")
    return format_number(_evaluate(tree.body))


def format_number(value: Number) -> str:
    """An integer as its digits; a decimal with ``SIGNIFICANT_DIGITS`` digits (a whole one as an integer)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else f"{value:.{SIGNIFICANT_DIGITS}g}"


def _depth(node: ast.AST) -> int:
    """How deep the tree goes, without recursion (a hostile tree may be deeper than Python's stack)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _evaluate(node: ast.AST) -> Number:
    """The value of an accepted node; the depth check above bounds this recursion."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"{node.value!r} is not a number")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        return _bounded(_apply(node.op, left, right))
    if isinstance(node, ast.BinOp):
        hint = _HINTS.get(type(node.op), "use + - * / or **")
        raise CalculatorError(f"the operator {type(node.op).__name__} is not allowed; {hint}")
    raise CalculatorError(f"only numbers, + - * / **, parentheses and unary minus are allowed; found "
                          f"{_describe(node)}")


def _apply(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right  # both under 10**15: the product has at most 30 digits
    if isinstance(op, ast.Div):
        if right == 0:
            raise CalculatorError("division by zero")
        return left // right if isinstance(left, int) and isinstance(right, int) and left % right == 0 \
            else left / right
    return _power(left, right)


def _power(base: Number, exponent: Number) -> Number:
    """``base ** exponent`` for a whole exponent up to MAX_EXPONENT, refused before it is computed
    when the result would reach MAX_MAGNITUDE (its logarithm says so)."""
    if not float(exponent).is_integer() or abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"a power's exponent must be a whole number from -{MAX_EXPONENT} to "
                              f"{MAX_EXPONENT}, got {format_number(exponent)}")
    exponent = int(exponent)
    if base == 0:
        if exponent < 0:
            raise CalculatorError("division by zero (0 to a negative power)")
        return 1 if exponent == 0 else 0
    if exponent * math.log10(abs(base)) >= math.log10(MAX_MAGNITUDE):
        raise CalculatorError(f"{format_number(base)}**{exponent} is too large (the limit is "
                              f"{MAX_MAGNITUDE:.0e})")
    return base ** exponent  # a negative exponent gives a float, which underflows to 0 rather than failing


def _bounded(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value) or abs(value) >= MAX_MAGNITUDE:
        raise CalculatorError(f"a number is too large (the limit is {MAX_MAGNITUDE:.0e})")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Attribute):
        return f"the attribute .{node.attr}"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, ast.UnaryOp):
        return f"the unary operator {type(node.op).__name__}"
    return f"a {type(node).__name__}"
