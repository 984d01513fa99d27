"""Finding the program in a model's reply and assembling it with the task prompt."""

from __future__ import annotations

import ast
import re

FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(action: str) -> str | None:
    """The last fenced code block (```python preferred over an untagged one), or None."""
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer(action)]
    if not blocks:
        return None
    tagged = [body for tag, body in blocks if tag]
    return (tagged or [body for _, body in blocks])[-1]


def defines(code: str, name: str) -> bool:
    """True when ``code`` parses and defines ``name`` at top level (function, class or assignment)."""
    from astraflow.envs.code.harness import parse_python

    try:
        tree = parse_python(code)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name == name
        ):
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return True
    return False


def assemble(prompt: str, code: str, entry_point: str) -> tuple[str, str]:
    """The program to test and how it was assembled.

    A reply that defines ``entry_point`` itself is appended after the prompt (``"full"``: the prompt
    still supplies imports and helper functions, the reply's definition wins); otherwise the reply is
    taken as the continuation of the prompt's function (``"completion"``).
    """
    if not prompt:
        return code, "program"
    if entry_point and defines(code, entry_point):
        return prompt.rstrip() + "\n\n\n" + code, "full"
    return prompt + code, "completion"
