"""Conversations with tools rendered through a tokenizer's chat template.

A template that knows tools (Qwen, Llama 3.1+, Mistral, Hermes: it reads ``tools`` and
``message.tool_calls``) is given them as they are (``apply_chat_template(..., tools=...)``). A
template that does not (the built-in tiny policies, base models) gets the conversation rewritten
into plain messages it can render, hermes-style: the tools listed in the system message, one
compact line each (``name(arg: type, ...): description``; a tiny policy has a short context), an
assistant's calls as ``<tool_call>`` blocks in its content, a tool result as a ``tool`` message (or
a ``user`` message in ``<tool_response>`` tags when the template has no ``tool`` role). The rewrite is deterministic, so rendering a conversation in pieces (the workflows
append the new messages' ids only) gives the same text as rendering it whole.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from astraflow.tools.calls import ToolCall
from astraflow.tools.parsers import HermesParser

_HERMES = HermesParser()

TOOLS_HEADER = "Tools:\n"
TOOLS_FOOTER = '\nCall one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>'


def _template(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else ""


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's own template renders ``tools`` and ``tool_calls``."""
    template = _template(tokenizer)
    return "tools" in template and "tool_calls" in template


def _has_tool_role(tokenizer: Any) -> bool:
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}], tokenize=False
        )
    except Exception:  # noqa: BLE001 - a template that refuses the role raises anything
        return False
    return True


def tool_line(tool: dict[str, Any]) -> str:
    """One tool as ``name(arg: type, opt?: type): description`` (``?``: not required)."""
    fn = tool.get("function", tool)
    params = fn.get("parameters") or {}
    required = set(params.get("required") or ())
    args = []
    for name, prop in (params.get("properties") or {}).items():
        kind = prop.get("type", "any") if isinstance(prop, dict) else "any"
        kind = "|".join(kind) if isinstance(kind, list) else kind
        args.append(f"{name}{'' if name in required else '?'}: {kind}")
    description = (fn.get("description") or "").strip().split("\n")[0]
    return f"{fn['name']}({', '.join(args)})" + (f": {description}" if description else "")


def tools_system_text(tools: Sequence[dict[str, Any]]) -> str:
    """The hermes-style tool list a template without tools support gets in its system message."""
    return TOOLS_HEADER + "\n".join(tool_line(t) for t in tools) + TOOLS_FOOTER


def content_text(content: Any) -> str:
    """A message's content as text: ``None`` is empty, a list of parts is their text joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def plain_messages(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, tool_role: bool
) -> list[dict[str, str]]:
    """``messages`` (with tool calls and tool results) as role/content text messages."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, text = m["role"], content_text(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = [ToolCall.from_openai(c) for c in m["tool_calls"]]
            text = (text + "\n" if text else "") + _HERMES.format_calls(calls)
        elif role == "tool" and not tool_role:
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        out.append({"role": role, "content": text})
    if tools:
        system = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def render_chat(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The conversation as text, with ``tools`` (OpenAI ``tools`` entries) offered to the model."""
    if not _template(tokenizer):  # no template (base model): plain text turns
        plain = plain_messages(messages, tools, tool_role=True)
        return "".join(m["content"] + "\n" for m in plain)
    if not tools and all(_plain(m) for m in messages):  # nothing tool-related: render as is
        return tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
    if renders_tools(tokenizer):
        msgs = [_native(m) for m in messages]
        return tokenizer.apply_chat_template(
            msgs,
            tools=list(tools) if tools else None,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
    tool_role = any(m["role"] == "tool" for m in messages) and _has_tool_role(tokenizer)
    plain = plain_messages(messages, tools, tool_role)
    return tokenizer.apply_chat_template(
        plain, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _plain(message: dict[str, Any]) -> bool:
    return (
        message.get("role") != "tool"
        and not message.get("tool_calls")
        and isinstance(message.get("content"), str)
    )


def _native(message: dict[str, Any]) -> dict[str, Any]:
    """A message as tools-aware templates read it: text content, calls with object arguments."""
    out = {k: v for k, v in message.items() if v is not None}
    out["content"] = content_text(message.get("content"))
    if message.get("tool_calls"):
        calls = []
        for entry in message["tool_calls"]:
            call = ToolCall.from_openai(entry)
            calls.append(
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            )
        out["tool_calls"] = calls
    return out


def forced_call_prefix(parser: Any, tools: Sequence[dict[str, Any]], choice: str | None) -> str:
    """What to prefill so that the turn calls a tool: ``choice`` a tool name (that call's opening;
    the whole call when the tool takes no parameters: nothing is left for the model to choose),
    ``"required"`` (the opening of a call to the only tool, or of any call), else nothing."""
    if choice in (None, "auto", "none"):
        return ""
    functions = {t["function"]["name"]: t["function"] for t in tools}
    if choice == "required":
        if len(functions) == 1:
            choice = next(iter(functions))
        else:
            return parser.call_opening("\0").split(json.dumps("\0"))[0]
    if choice not in functions:
        raise ValueError(
            f"tool_choice names {choice!r}, which is not a tool ({', '.join(functions)})"
        )
    prefix = parser.call_opening(choice)
    if not (functions[choice].get("parameters") or {}).get("properties"):
        prefix += "{}" + parser.call_closing()
    return prefix
