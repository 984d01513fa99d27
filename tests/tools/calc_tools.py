"""Tools for the tests: plain Python functions, documented the way ``get_json_schema`` reads."""

from __future__ import annotations

import asyncio

CALLS: list[str] = []


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: digits and + - * / ( ), e.g. 123*456
    """
    CALLS.append(expression)
    if not set(expression) <= set("0123456789+-*/() "):
        raise ValueError(f"not arithmetic: {expression!r}")
    return str(eval(expression))  # noqa: S307 - the character set above is checked


async def lookup(key: str, delay_s: float = 0.0) -> dict:
    """Look a key up in a small table.

    Args:
        key: the key
        delay_s: seconds to wait first (an I/O-bound tool)
    """
    await asyncio.sleep(delay_s)
    return {"key": key, "value": {"pi": 3.14}.get(key)}


def exact(answer: str, task: dict) -> float:
    return float(answer.strip() == task["answer"])


def hint() -> str:
    """Give a hint for the question."""
    import os

    log = os.environ.get("ASTRAFLOW_TEST_TOOL_LOG")
    if log:
        with open(log, "a") as f:
            f.write("hint\n")
    return "sum"


def is_number(answer: str, task: dict) -> float:
    """Reward of the tool training tests: 1 for an answer that is a number (the tiny policy's
    answers vary on that, so a group has a reward spread to learn from), else 0."""
    return float(answer.strip().lstrip("-").isdigit())
