"""A verifiers tool environment (ToolEnv): 3-digit products, a calculator tool, exact answers."""

import random

import verifiers as vf
from datasets import Dataset


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: integers combined with + - * and parentheses, e.g. "347*58".

    Returns:
        The value as a decimal integer.
    """
    if not set(expression) <= set("0123456789+-*() "):
        return "error: only integers, + - * and parentheses"
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - digits and operators only


def products(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        rows.append({"question": f"{a}*{b}", "answer": str(a * b)})
    return Dataset.from_list(rows)


def correct(completion, answer, parser) -> float:
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


def load_environment(max_turns: int = 2, **kwargs) -> vf.Environment:
    return vf.ToolEnv(
        tools=[calculator], dataset=products(64, 0), eval_dataset=products(16, 1),
        rubric=vf.Rubric(funcs=[correct]), max_turns=max_turns, **kwargs,
    )  # fmt: skip
