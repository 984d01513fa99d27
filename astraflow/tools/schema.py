"""Python functions as tools: a recipe's ``"package.module:function"`` -> callable + JSON schema.

Why transformers' ``get_json_schema``: it is what chat templates' ``tools=`` argument is built for
(the same reader TRL uses), so a function's signature and Google-style docstring are its schema;
a function without a usable docstring gets an error naming what is missing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from astraflow.plugins import import_location

TOOL_FORMAT = "'package.module:function' or 'path/to/file.py:function'"


class ToolDefinitionError(ValueError):
    """A tool reference that does not name a documented function."""


@dataclass(frozen=True)
class FunctionTool:
    """One callable tool: its OpenAI ``tools`` entry and whether it is a coroutine function."""

    fn: Callable[..., Any]
    schema: dict[str, Any]

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


def _import(ref: str) -> Callable[..., Any]:
    if ref.count(":") != 1 or not all(ref.split(":")):
        raise ToolDefinitionError(f"a tool must be {TOOL_FORMAT}, got {ref!r}")
    where, name = ref.split(":")
    try:
        module = import_location(where, "astraflow_tools")
    except Exception as exc:
        raise ToolDefinitionError(
            f"tool {ref!r}: cannot import {where!r} ({type(exc).__name__}: {exc})"
        ) from exc
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ToolDefinitionError(f"tool {ref!r}: {where!r} has no function {name!r}")
    return fn


def function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s OpenAI tool entry ``{"type": "function", "function": {name, description,
    parameters}}`` from its signature and docstring."""
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as exc:  # DocstringParsingException, TypeHintParsingException
        raise ToolDefinitionError(
            f"tool {getattr(fn, '__name__', fn)!r}: {exc} (a tool needs type hints on every "
            "argument and a docstring with a description and an 'Args:' entry per argument)"
        ) from None
    schema["function"].pop("return", None)
    return schema


def load_tool(ref: str | Callable[..., Any]) -> FunctionTool:
    fn = _import(ref) if isinstance(ref, str) else ref
    return FunctionTool(fn, function_schema(fn))


def load_tools(refs: Sequence[str | Callable[..., Any]]) -> list[FunctionTool]:
    """The tools ``refs`` name, in order; two tools with one name are an error."""
    if isinstance(refs, str):
        refs = [refs]
    tools = [load_tool(r) for r in refs]
    names = [t.name for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ToolDefinitionError(f"two tools are named {', '.join(dupes)}; tool names must differ")
    return tools
