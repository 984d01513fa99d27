"""The calculator task set and its tool: products too hard for the tiny policy to do in its head.

A task is a product of two 3-digit numbers (``"347*582"``, answer ``"201954"``).
``builtin:tiny-tools`` cannot multiply like that, but it can call :func:`calculator` in the hermes
format and copy the result, so success measures tool use, not arithmetic. Train and test come from
disjoint seeds and are de-duplicated against each other, as in :mod:`astraflow.tasks.arith`.

:func:`calculator` is the tool itself (a recipe names it ``astraflow.tasks.calculator:calculator``): a plain
Python function whose signature and docstring give its JSON schema.
"""

from __future__ import annotations

import ast
import operator
import random
from typing import Any

SPLIT_SIZES = {"train": 20_000, "test": 500}
_SPLIT_SEEDS = {"train": 2_000_003, "test": 8_888_887}
#: Longest expression the calculator evaluates (characters) and largest magnitude it returns.
MAX_EXPRESSION = 64
MAX_MAGNITUDE = 10**12

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def problem(rng: random.Random) -> dict[str, Any]:
    # Always 7 characters: the call copies the question at one fixed offset, which a 4-layer
    # character-level model learns in a few hundred steps (mixed lengths took several times more).
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return {"question": f"{a}*{b}", "answer": str(a * b)}


def generate(
    split: str = "train", seed: int = 0, size: int | None = None, **_: Any
) -> list[dict[str, Any]]:
    """Deterministic problems for ``split``; ``seed`` shifts the train stream, never the test set."""
    if split not in SPLIT_SIZES:
        raise ValueError(f"calculator split must be one of {sorted(SPLIT_SIZES)}, got {split!r}")
    n = size if size is not None else SPLIT_SIZES[split]
    test_rng = random.Random(_SPLIT_SEEDS["test"])
    test: list[dict[str, Any]] = []
    seen_test: set[str] = set()
    while len(test) < SPLIT_SIZES["test"]:
        p = problem(test_rng)
        if p["question"] not in seen_test:
            seen_test.add(p["question"])
            test.append(p)
    if split == "test":
        items = test[:n]
    else:
        rng = random.Random(_SPLIT_SEEDS["train"] + 31 * seed)
        items = []
        while len(items) < n:
            p = problem(rng)
            if p["question"] not in seen_test:
                items.append(p)
    for i, p in enumerate(items):
        p["id"] = f"calculator-{split}-{i}"
    return items


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: integers combined with + - * // % and parentheses, e.g. "347*58".

    Returns:
        The value as a decimal integer, or a message starting with "error:" naming what was wrong.
    """
    if not isinstance(expression, str):
        return f"error: expression must be a string, got {type(expression).__name__}"
    if len(expression) > MAX_EXPRESSION:
        return f"error: expression longer than {MAX_EXPRESSION} characters"
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _evaluate(tree.body)
    except SyntaxError:
        return f"error: not an arithmetic expression: {expression!r}"
    except (ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(value)


def _evaluate(node: ast.AST) -> int:
    """Integer arithmetic over a parsed expression: no names, calls or powers (bounded work)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        value = _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError(f"result exceeds {MAX_MAGNITUDE:.0e}")
        return value
    raise ValueError(f"unsupported element {type(node).__name__} (integers and + - * // % only)")
