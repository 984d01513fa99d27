"""A safe arithmetic evaluator for tools that the policy calls.

Why this exists: a calculator tool is the first tool anyone writes, and the obvious one,
``eval(expression, {"__builtins__": {}})``, runs whatever the policy writes: empty builtins do not
stop ``().__class__.__bases__[0].__subclasses__()`` from reaching ``os.system``, and even plain
arithmetic such as ``9**9**9`` takes the node's CPU and memory for minutes. A policy's text is
untrusted input (issue 48, finding 5), so a tool must never hand it to ``eval``.

:func:`evaluate` parses the text with :mod:`ast` and walks the tree itself. It accepts numbers
(ints and finite floats), ``+ - * / // % **``, unary ``-``/``+`` and parentheses, and nothing
else: names, attributes, calls, subscripts, strings, comprehensions and every other node are
refused with :class:`ArithmeticRefused` (a ``ValueError``) naming the element and what is
accepted. Work is bounded before it is done: the text's length, the tree's depth, the exponent of
``**`` and the size of every intermediate value, so no input takes more than microseconds.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

#: Longest expression accepted (characters).
MAX_EXPRESSION = 256
#: Deepest nesting accepted (operators and parentheses); bounds recursion.
MAX_DEPTH = 32
#: Largest exponent ``**`` accepts (absolute value).
MAX_EXPONENT = 64
#: Largest magnitude of any value, literal or intermediate.
MAX_MAGNITUDE = 10**30

ACCEPTED = "numbers, + - * / // % **, unary minus and parentheses"


class ArithmeticRefused(ValueError):
    """The expression is not plain, bounded arithmetic; the message says what was wrong."""


_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def evaluate(expression: str) -> int | float:
    """The value of ``expression`` (an int, or a float when ``/`` or a float literal is used).

    Raises :class:`ArithmeticRefused` for anything but bounded arithmetic, and for division by
    zero, with a message a model can read and act on.
    """
    if not isinstance(expression, str):
        raise ArithmeticRefused(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION:
        raise ArithmeticRefused(
            f"expression is {len(expression)} characters; at most {MAX_EXPRESSION} accepted"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise ArithmeticRefused(
            f"not an arithmetic expression: {expression!r} (accepted: {ACCEPTED})"
        ) from None
    return _walk(tree.body, 0)


def _walk(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise ArithmeticRefused(f"expression nested deeper than {MAX_DEPTH} levels")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _walk(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _walk(node.left, depth + 1)
        right = _walk(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ArithmeticRefused("division by zero") from None
        except OverflowError:
            raise ArithmeticRefused(f"value exceeds {MAX_MAGNITUDE:.0e}") from None
        if isinstance(value, complex):  # (-8) ** 0.5
            raise ArithmeticRefused("result is not a real number")
        return _bounded(value)
    raise ArithmeticRefused(f"{_describe(node)} is not accepted (accepted: {ACCEPTED})")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse a power before computing it: ``9**9**9`` must cost nothing to refuse."""
    if abs(exponent) > MAX_EXPONENT:
        raise ArithmeticRefused(f"exponent {exponent} is outside -{MAX_EXPONENT}..{MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise ArithmeticRefused("division by zero")
    if abs(base) > 1 and abs(exponent) * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise ArithmeticRefused(f"value exceeds {MAX_MAGNITUDE:.0e}")


def _bounded(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ArithmeticRefused("value is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise ArithmeticRefused(f"value exceeds {MAX_MAGNITUDE:.0e}")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        return f"the constant {type(node.value).__name__}"
    if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.BoolOp)):
        return f"the operator {type(node.op).__name__}"
    return f"the element {type(node).__name__}"
