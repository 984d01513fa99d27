"""Function calling on the OpenAI-compatible surface: ``tools``, ``tool_choice``, ``tool_calls``.

What the chat route does with a request that offers tools (the ``openai`` SDK's and the Agents
SDK's shape):

- ``tools`` are rendered into the prompt by the chat template
  (:func:`astraflow.tools.chat.render_chat`); with ``tool_choice = "none"`` they are still
  rendered (the prompt of a conversation stays the same from call to call) but the reply is not
  read for calls.
- The reply is read by the served policy's tool parser (``tool_parser``; ``auto``: from the chat
  template); calls come back as ``message.tool_calls`` (ids ``call_...``, arguments a JSON string)
  with ``finish_reason = "tool_calls"``; a call that does not parse is returned as the text the
  model wrote (``finish_reason`` as generated) and counted by a recorder as ``invalid_tool_call``.
- ``tool_choice = "required"`` or a named function is enforced by prefilling the call's opening in
  the parser's format (``<tool_call>\\n{"name": "NAME", "arguments": `` for hermes); the model
  writes the rest. A named function without parameters is prefilled whole: its call is fully
  determined (:func:`astraflow.tools.chat.forced_call_prefix`). Prefilled tokens are context (not
  trained on), the generated ones are the turn.
- ``parallel_tool_calls = false`` returns the first call only.

Fields that would change behaviour but are not implemented (``response_format`` other than text,
``logit_bias``, non-zero penalties, the legacy ``functions``, audio...) are refused with a 400 that
names them, instead of being silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict, Field

from astraflow.tools.calls import ParsedTurn, ToolCall
from astraflow.tools.chat import content_text, forced_call_prefix
from astraflow.tools.parsers import ToolParser


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: ToolFunction

    def schema(self) -> dict[str, Any]:
        """The entry a chat template's ``tools`` reads."""
        fn = self.function.model_dump(exclude_none=True)
        fn.pop("strict", None)
        fn.setdefault("parameters", {"type": "object", "properties": {}})
        return {"type": "function", "function": fn}


class NamedFunction(BaseModel):
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: ToolCallFunction


def _set(value: Any) -> bool:
    return value not in (None, False, 0, 0.0, "", [], {})


#: field -> whether a value of it asks for something this server does not do
UNSUPPORTED: dict[str, Any] = {
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "logit_bias": _set,
    "frequency_penalty": _set,
    "presence_penalty": _set,
    "repetition_penalty": lambda v: v not in (None, 1, 1.0),
    "functions": _set,
    "function_call": _set,
    "top_logprobs": _set,
    "audio": _set,
    "modalities": lambda v: v not in (None, ["text"]),
    "prediction": _set,
    "web_search_options": _set,
    "best_of": lambda v: v not in (None, 1),
    "echo": _set,
    "suffix": _set,
    "guided_json": _set,
    "guided_regex": _set,
    "guided_choice": _set,
    "guided_grammar": _set,
    "structured_outputs": _set,
}


def refuse_unsupported(body: BaseModel) -> None:
    """400 for each request field that would change the reply and is not implemented here."""
    extra = body.model_extra or {}
    bad = [k for k, asks in UNSUPPORTED.items() if k in extra and asks(extra[k])]
    if bad:
        raise HTTPException(
            400,
            f"unsupported request field(s) {', '.join(bad)}: this server does not implement "
            "them and will not ignore them silently; leave them out (or at their defaults)",
        )


@dataclass(frozen=True)
class ToolPlan:
    """How one chat call handles tools: what is rendered, what is prefilled, how it is read."""

    tools: list[dict[str, Any]] | None
    parser: ToolParser | None
    prefill: str = ""
    parallel: bool = True

    @property
    def active(self) -> bool:
        return self.parser is not None


def plan_tools(
    tools: list[ToolSpec] | None,
    choice: Any,
    parallel: bool | None,
    parser: ToolParser,
) -> ToolPlan:
    """The :class:`ToolPlan` of a request (400 for a ``tool_choice`` that names no offered tool)."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise HTTPException(400, f"tool_choice {_choice_text(choice)} needs `tools`")
        return ToolPlan(None, None)
    schemas = [t.schema() for t in tools]
    if choice == "none":
        return ToolPlan(schemas, None)
    name = choice.function.name if isinstance(choice, NamedToolChoice) else choice
    try:
        prefill = forced_call_prefix(parser, schemas, name)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    return ToolPlan(schemas, parser, prefill, parallel is not False)


def _choice_text(choice: Any) -> str:
    return repr(choice.function.name) if isinstance(choice, NamedToolChoice) else repr(choice)


def read_reply(plan: ToolPlan, text: str) -> tuple[dict[str, Any], ParsedTurn | None]:
    """The assistant message for a generated turn (``text`` includes any prefill), and the
    parsed turn (None when tools are not in play)."""
    if not plan.active:
        return {"role": "assistant", "content": text}, None
    turn = plan.parser.parse(text)
    if not turn.valid or not turn.calls:
        content = turn.content if turn.valid else text
        message: dict[str, Any] = {"role": "assistant", "content": content}
    else:
        calls = turn.calls if plan.parallel else turn.calls[:1]
        message = {
            "role": "assistant",
            "content": turn.content or None,
            "tool_calls": [c.to_openai() for c in calls],
        }
    if turn.reasoning is not None:
        message["reasoning_content"] = turn.reasoning
    return message, turn


def tool_call_deltas(index: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """``delta.tool_calls`` chunks' choices of one reply: each call's id and name, then its
    arguments (the shape OpenAI streams and the SDKs accumulate)."""
    out = []
    for i, call in enumerate(message.get("tool_calls") or []):
        head = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        args = {"index": i, "function": {"arguments": call["function"]["arguments"]}}
        for part in (head, args):
            out.append({"index": index, "delta": {"tool_calls": [part]}, "finish_reason": None})
    return out


def canonical_message(message: dict[str, Any]) -> tuple:
    """A message as history is compared: role, text, tool call ids, names and arguments
    (arguments as parsed JSON, so a client re-serialising them is not a rewrite)."""
    calls = tuple(
        (c.id, c.name, json.dumps(c.arguments, sort_keys=True))
        for c in (ToolCall.from_openai(e) for e in message.get("tool_calls") or [])
    )
    return (
        message.get("role"),
        content_text(message.get("content")),
        message.get("tool_call_id"),
        calls,
    )
