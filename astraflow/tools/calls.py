"""What one assistant turn says once its tool calls are read out of the generated text.

Why a type of its own: the same parsed turn feeds three places (the OpenAI surface's
``message.tool_calls``, the env that runs the calls, the episode's ``finish_reason``), and a
malformed call must travel as data (an episode outcome) rather than as an exception.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

#: ``finish_reason`` of an episode (and of a chat reply) whose turn held a call that did not parse.
INVALID_TOOL_CALL = "invalid_tool_call"


def new_call_id() -> str:
    """An OpenAI-style tool call id (``call_`` and 24 url-safe characters)."""
    return "call_" + secrets.token_urlsafe(18)


@dataclass(frozen=True)
class ToolCall:
    """One function call: its id (what the tool message answers), name and decoded arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_call_id)

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_openai(self) -> dict[str, Any]:
        """The ``message.tool_calls`` entry OpenAI clients read."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json()},
        }

    @classmethod
    def from_openai(cls, entry: Any) -> ToolCall:
        """A ``tool_calls`` entry a client sent back (arguments as a JSON string or an object)."""
        if not isinstance(entry, dict) or not isinstance(entry.get("function"), dict):
            raise ValueError(
                "a tool call must be {'id': str, 'type': 'function', 'function': "
                f"{{'name': str, 'arguments': str}}}}, got {entry!r:.120}"
            )
        fn = entry["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tool call's function needs a name, got {fn!r:.120}")
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"tool call {name!r}: arguments are not JSON ({exc}): {args!r:.120}"
                ) from None
        if not isinstance(args, dict):
            raise ValueError(f"tool call {name!r}: arguments must be a JSON object, got {args!r}")
        return cls(name, args, str(entry.get("id") or new_call_id()))


@dataclass(frozen=True)
class ParsedTurn:
    """One generated turn split into what the user sees, the reasoning and the calls.

    ``error`` is set (and names what was wrong) when the text tried to call a tool but the call
    did not parse: the turn's outcome is :data:`INVALID_TOOL_CALL`; ``calls`` then holds the
    calls that did parse, if any.
    """

    content: str
    calls: tuple[ToolCall, ...] = ()
    reasoning: str | None = None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.error is None
