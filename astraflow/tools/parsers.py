"""Tool-call parsers: one generated assistant turn -> content, reasoning and calls.

Why a registry: every model family writes calls its own way (what its chat template teaches it),
and a policy in a recipe says which one it speaks (``policies.NAME.tool_parser``, or ``"auto"``:
read from the tokenizer's chat template). The built-ins are registered in code; a plugin adds a
parser through the entry-point group ``astraflow.tool_parsers`` (a :class:`ToolParser` instance, or
a callable returning one or several).

=============  ===========================================================================
``hermes``      Qwen2.5, Qwen3, Hermes 2/3 (and AstraFlow's default template):
                ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
``llama3_json`` Llama 3.1 / 3.2 / 3.3 JSON calls: ``{"name": ..., "parameters": {...}}``
``mistral``     Mistral: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`` (v3) or
                ``[TOOL_CALLS]name[ARGS]{...}`` (v11 tokenizers)
``pythonic``    Llama 3.2 / Llama 4 pythonic lists: ``[get_weather(city="Paris"), ...]``
=============  ===========================================================================

A parser never raises on what a model wrote: a call that does not parse comes back as
``ParsedTurn.error`` (the turn's outcome is ``invalid_tool_call``).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from astraflow.registry import Registry, call_or_take, expect_type
from astraflow.tools.calls import ParsedTurn, ToolCall

GROUP = "astraflow.tool_parsers"
#: The recipe value that picks a parser from the tokenizer's chat template.
AUTO = "auto"
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


class UnknownToolParserError(KeyError):
    """A ``tool_parser`` name no parser is registered under."""

    def __str__(self) -> str:
        return str(self.args[0])


def split_reasoning(text: str) -> tuple[str | None, str]:
    """``(reasoning, rest)`` of a turn that thinks in ``<think>...</think>`` (Qwen3, DeepSeek-R1).

    The opening tag may be missing (a template that opens the think block in the generation
    prompt); a turn without ``</think>`` has no reasoning."""
    if _THINK_CLOSE not in text:
        return None, text
    head, _, rest = text.partition(_THINK_CLOSE)
    head = head.strip()
    if head.startswith(_THINK_OPEN):
        head = head[len(_THINK_OPEN) :]
    return head.strip(), rest


def _arguments(obj: dict[str, Any], keys: Sequence[str]) -> dict[str, Any] | str:
    """The call's arguments as an object, or a message saying why they are not one."""
    for key in keys:
        if key in obj:
            args = obj[key]
            break
    else:
        return {}
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"arguments are a string that is not JSON: {args!r:.80}"
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    return args


def _call(obj: Any, arg_keys: Sequence[str] = ("arguments", "parameters")) -> ToolCall | str:
    """A decoded call object -> :class:`ToolCall`, or a message saying what is wrong with it."""
    if not isinstance(obj, dict):
        return f"a call must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f"a call needs a string 'name', got {obj!r:.80}"
    args = _arguments(obj, arg_keys)
    if isinstance(args, str):
        return f"call {name!r}: {args}"
    if isinstance(obj.get("id"), str) and obj["id"]:
        return ToolCall(name.strip(), args, obj["id"])
    return ToolCall(name.strip(), args)


def _json_objects(text: str) -> tuple[list[Any], str]:
    """Consecutive JSON values at the start of ``text`` (separated by whitespace, ``;`` or
    ``,``), and what follows them."""
    decoder = json.JSONDecoder()
    found, pos = [], 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n;,":
            pos += 1
        if pos >= len(text) or text[pos] not in "{[":
            return found, text[pos:]
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return found, text[pos:]
        found.append(value)


@dataclass(frozen=True)
class ToolParser:
    """Base of tool-call parsers; subclasses set :attr:`name` and implement :meth:`parse_calls`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: Special tokens the parser reads (kept when the turn's ids are decoded, see :func:`turn_text`).
    markers: ClassVar[tuple[str, ...]] = ()

    def parse(self, text: str, token_ids: Sequence[int] | None = None) -> ParsedTurn:
        """Split one generated turn (its text decoded with :func:`turn_text`)."""
        reasoning, rest = split_reasoning(text)
        content, calls, error = self.parse_calls(rest)
        return ParsedTurn(content.strip(), tuple(calls), reasoning, error)

    def parse_calls(self, text: str) -> tuple[str, list[ToolCall], str | None]:
        """``(content, calls, error)`` of a turn without its reasoning."""
        raise NotImplementedError

    def format_calls(self, calls: Iterable[ToolCall]) -> str:
        """The calls as this family's models write them (a default template renders past turns
        with it; tests write model outputs with it)."""
        raise NotImplementedError

    def call_opening(self, name: str) -> str:
        """The text that starts a call to ``name``, up to where its arguments begin (a forced
        ``tool_choice`` prefills it)."""
        raise NotImplementedError

    def call_closing(self) -> str:
        """The text after a call's arguments object (ends a call opened by :meth:`call_opening`)."""
        raise NotImplementedError


@dataclass(frozen=True)
class HermesParser(ToolParser):
    name: ClassVar[str] = "hermes"
    description: ClassVar[str] = (
        'Qwen2.5/Qwen3/Hermes: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>'
    )
    markers: ClassVar[tuple[str, ...]] = ("<tool_call>", "</tool_call>", _THINK_OPEN, _THINK_CLOSE)
    _BLOCK: ClassVar[re.Pattern] = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)

    def parse_calls(self, text: str) -> tuple[str, list[ToolCall], str | None]:
        calls, errors = [], []
        for match in self._BLOCK.finditer(text):
            body, closed = match.group(1), bool(match.group(2))
            if not closed:
                errors.append("a <tool_call> block is not closed with </tool_call>")
                continue
            values, rest = _json_objects(body.strip())
            if len(values) != 1 or rest.strip():
                errors.append(f"a <tool_call> block must hold one JSON object, got {body!r:.80}")
                continue
            call = _call(values[0])
            (calls if isinstance(call, ToolCall) else errors).append(call)
        content = self._BLOCK.sub("", text)
        return content, calls, "; ".join(errors) or None

    def format_calls(self, calls: Iterable[ToolCall]) -> str:
        return "\n".join(
            f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>"
            for c in calls
        )

    def call_opening(self, name: str) -> str:
        return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": '

    def call_closing(self) -> str:
        return "}\n</tool_call>"


@dataclass(frozen=True)
class Llama3JsonParser(ToolParser):
    name: ClassVar[str] = "llama3_json"
    description: ClassVar[str] = 'Llama 3.1-3.3 JSON: {"name": ..., "parameters": {...}}'
    markers: ClassVar[tuple[str, ...]] = ("<|python_tag|>",)

    def parse_calls(self, text: str) -> tuple[str, list[ToolCall], str | None]:
        body = text.strip()
        tagged = body.startswith("<|python_tag|>")
        if tagged:
            body = body[len("<|python_tag|>") :].lstrip()
        if not body.startswith("{"):
            return text, [], None
        values, rest = _json_objects(body)
        if not values:
            return "", [], f"the turn starts a JSON call that does not parse: {body!r:.80}"
        calls, errors = [], []
        for value in values:
            call = _call(value, ("parameters", "arguments"))
            (calls if isinstance(call, ToolCall) else errors).append(call)
        if rest.strip():
            errors.append(f"text after the JSON call(s): {rest.strip()!r:.80}")
        return "", calls, "; ".join(errors) or None

    def format_calls(self, calls: Iterable[ToolCall]) -> str:
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}) for c in calls)

    def call_opening(self, name: str) -> str:
        return f'{{"name": {json.dumps(name)}, "parameters": '

    def call_closing(self) -> str:
        return "}"


@dataclass(frozen=True)
class MistralParser(ToolParser):
    name: ClassVar[str] = "mistral"
    description: ClassVar[str] = (
        'Mistral: [TOOL_CALLS] [{"name": ..., "arguments": {...}}] or [TOOL_CALLS]name[ARGS]{...}'
    )
    markers: ClassVar[tuple[str, ...]] = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")

    def parse_calls(self, text: str) -> tuple[str, list[ToolCall], str | None]:
        if "[TOOL_CALLS]" not in text:
            return text, [], None
        content, *parts = text.split("[TOOL_CALLS]")
        calls, errors = [], []
        for part in parts:
            part = part.strip()
            if "[ARGS]" in part and not part.startswith(("[", "{")):  # v11: name[ARGS]{...}
                name, _, args_text = part.partition("[ARGS]")
                call_id = None
                if "[CALL_ID]" in name:
                    name, _, call_id = name.partition("[CALL_ID]")
                values, rest = _json_objects(args_text)
                if len(values) != 1 or rest.strip():
                    errors.append(
                        f"call {name.strip()!r}: arguments do not parse: {args_text!r:.80}"
                    )
                    continue
                obj = {"name": name.strip(), "arguments": values[0]}
                if call_id:
                    obj["id"] = call_id.strip()
                call = _call(obj)
                (calls if isinstance(call, ToolCall) else errors).append(call)
                continue
            values, rest = _json_objects(part)
            if not values or rest.strip():
                errors.append(
                    f"[TOOL_CALLS] must be followed by a JSON list of calls: {part!r:.80}"
                )
                continue
            for value in values:
                for obj in value if isinstance(value, list) else [value]:
                    call = _call(obj)
                    (calls if isinstance(call, ToolCall) else errors).append(call)
        return content, calls, "; ".join(errors) or None

    def format_calls(self, calls: Iterable[ToolCall]) -> str:
        body = [{"name": c.name, "arguments": c.arguments} for c in calls]
        return "[TOOL_CALLS] " + json.dumps(body)

    def call_opening(self, name: str) -> str:
        return f'[TOOL_CALLS] [{{"name": {json.dumps(name)}, "arguments": '

    def call_closing(self) -> str:
        return "}]"


def _literal(node: ast.AST) -> Any:
    return ast.literal_eval(node)


@dataclass(frozen=True)
class PythonicParser(ToolParser):
    name: ClassVar[str] = "pythonic"
    description: ClassVar[str] = 'Llama 3.2/4 pythonic: [get_weather(city="Paris"), ...]'
    markers: ClassVar[tuple[str, ...]] = ("<|python_start|>", "<|python_end|>")

    def parse_calls(self, text: str) -> tuple[str, list[ToolCall], str | None]:
        body = text.strip()
        body = body.removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
        if not (body.startswith("[") and re.match(r"\[\s*[A-Za-z_][\w.]*\s*\(", body)):
            return text, [], None
        try:
            tree = ast.parse(body, mode="eval").body
        except SyntaxError as exc:
            return "", [], f"the pythonic call list does not parse: {exc.msg}: {body!r:.80}"
        if not isinstance(tree, ast.List):
            return "", [], f"pythonic calls must be one list, got {body!r:.80}"
        calls, errors = [], []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or node.args:
                errors.append(f"each entry must be name(key=value, ...): {ast.unparse(node)!r:.80}")
                continue
            try:
                args = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
            except (ValueError, SyntaxError):
                errors.append(f"arguments must be literals: {ast.unparse(node)!r:.80}")
                continue
            calls.append(ToolCall(ast.unparse(node.func), args))
        return "", calls, "; ".join(errors) or None

    def format_calls(self, calls: Iterable[ToolCall]) -> str:
        def one(c: ToolCall) -> str:
            return f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items())})"

        return "[" + ", ".join(one(c) for c in calls) + "]"

    def call_opening(self, name: str) -> str:
        return f"[{name}("

    def call_closing(self) -> str:
        return ")]"


BUILTIN_PARSERS: tuple[ToolParser, ...] = (
    HermesParser(),
    Llama3JsonParser(),
    MistralParser(),
    PythonicParser(),
)


def tool_parsers() -> Registry[ToolParser]:
    """A fresh registry: the built-ins, then the ``astraflow.tool_parsers`` plugins."""

    def accept(obj: Any, _ep: Any) -> ToolParser:
        expect_type(obj, ToolParser)
        return obj

    return Registry(
        "tool parser",
        lambda parser: parser.name,
        group=GROUP,
        builtins=lambda: BUILTIN_PARSERS,
        unpack=lambda ep: call_or_take(ep, ToolParser),
        accept=accept,
        origin=lambda parser: f"{type(parser).__module__}.{type(parser).__qualname__}",
        unknown_error=UnknownToolParserError,
    )


def parser_for_template(chat_template: str | None) -> str:
    """The parser a chat template teaches its model (``"auto"``); ``hermes`` when the template
    says nothing about tools (AstraFlow then renders tools hermes-style, see ``tools.chat``)."""
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_start|>" in template:
        return "pythonic"
    if '"parameters"' in template or "<|python_tag|>" in template:
        return "llama3_json"
    return "hermes"


def get_tool_parser(
    name: str, tokenizer: Any = None, registry: Registry[ToolParser] | None = None
) -> ToolParser:
    """The parser ``name`` (``"auto"``: the one ``tokenizer``'s chat template implies)."""
    if name == AUTO:
        name = parser_for_template(_template_text(tokenizer))
    return (registry or tool_parsers()).get(name)


def _template_text(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the tool_use one, else the default
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else None


def turn_text(tokenizer: Any, token_ids: Sequence[int], parser: ToolParser) -> str:
    """One generated turn's text for ``parser``: special tokens dropped except the markers it
    reads (``[TOOL_CALLS]`` is a special token a plain ``skip_special_tokens`` decode loses)."""
    special = set(getattr(tokenizer, "all_special_ids", None) or ())
    if not special:  # a minimal tokenizer (the scripted engines' byte tokenizer)
        ends = (getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None))
        special = {t for t in ends if t is not None}
    keep: set[int] = set()
    for marker in parser.markers:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) == 1:
            keep.add(ids[0])
    ids = [t for t in token_ids if t not in special or t in keep]
    return tokenizer.decode(ids, skip_special_tokens=False)
