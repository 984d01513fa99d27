"""Loading, overriding and validating recipes, with errors a person can act on.

Every error names the file, the dotted key path, the offending value and what was expected; an
unknown key also gets a "did you mean" suggestion drawn from the schema.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from astraflow.errors import AstraFlowError
from astraflow.recipe.schema import Recipe


class RecipeError(AstraFlowError, ValueError):
    """A recipe that cannot be used; the message is meant to be shown as is."""


_OVERRIDE_HELP = "expected KEY.PATH=VALUE, e.g. --set run.max_steps=10"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as a TOML literal when it is one, else as a string.

    So ``3`` is an int, ``1e-4`` a float, ``true`` a bool, ``[1, 2]`` a list and ``hello`` (not
    valid TOML) the string "hello".
    """
    if "=" not in text:
        raise RecipeError(f"--set {text!r}: missing '='; {_OVERRIDE_HELP}")
    key, raw = text.split("=", 1)
    key = key.strip()
    parts = key.split(".")
    if not key or any(not p.strip() for p in parts):
        raise RecipeError(f"--set {text!r}: empty key segment in {key!r}; {_OVERRIDE_HELP}")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return [p.strip() for p in parts], value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides in place; list items are addressed by index (``tasks.sets.0.name``)."""
    for text in overrides:
        path, value = parse_override(text)
        node: Any = data
        for depth, part in enumerate(path[:-1]):
            where = ".".join(path[: depth + 1])
            if isinstance(node, list):
                node = _list_item(node, part, text, where)
                continue
            nxt = node.get(part)
            if nxt is None:
                if path[depth + 1].isdigit():
                    raise RecipeError(
                        f"--set {text!r}: {where} is not in the recipe, so it has no item "
                        f"{path[depth + 1]} to change; set the whole list instead, "
                        f"e.g. --set '{where}=[...]'"
                    )
                nxt = node[part] = {}
            if not isinstance(nxt, (dict, list)):
                raise RecipeError(
                    f"--set {text!r}: {where} is the value {nxt!r}, not a table; "
                    "it cannot hold sub-keys"
                )
            node = nxt
        last = path[-1]
        if isinstance(node, list):
            index = _index(node, last, text, ".".join(path))
            node[index] = value
        else:
            node[last] = value
    return data


def _index(items: list, part: str, text: str, where: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise RecipeError(
            f"--set {text!r}: {where} indexes a list of {len(items)} item(s); "
            f"expected an index 0..{len(items) - 1}"
        )
    return int(part)


def _list_item(items: list, part: str, text: str, where: str) -> Any:
    return items[_index(items, part, text, where)]


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The schema model that owns the key at ``loc[:-1]`` (for did-you-mean and descriptions).

    Walks the type annotations the same way pydantic walks the data: model fields by name,
    ``dict[str, X]`` values by key, ``list[X]`` items by index.
    """
    current: Any = Recipe
    for part in loc[:-1]:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        else:
            origin = get_origin(current)
            args = get_args(current)
            if origin is dict and len(args) == 2:
                current = args[1]
            elif origin is list and args:
                current = args[0]
            else:
                return None
    current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(ann: Any) -> Any:
    """Strip ``Optional``/``Union`` wrappers, keeping the first structured member."""
    if get_origin(ann) in (Union, UnionType):
        members = [a for a in get_args(ann) if a is not type(None)]
        for a in members:
            if (isinstance(a, type) and issubclass(a, BaseModel)) or get_origin(a) in (dict, list):
                return a
        return members[0] if members else ann
    return ann


def _field_info(loc: tuple):
    owner = _model_at(loc)
    if owner is None or not loc:
        return None
    return owner.model_fields.get(str(loc[-1]))


def _lookup(data: Any, loc: tuple) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return data


_MISSING = object()

#: Friendlier wording for pydantic error types whose message names Python types.
_EXPECTED = {
    "dict_type": "a table (e.g. [section] or { key = value })",
    "model_type": "a table (e.g. [section] or { key = value })",
    "model_attributes_type": "a table (e.g. [section] or { key = value })",
    "list_type": "a list (e.g. [1, 2])",
    "string_type": "a string (in quotes)",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
}


def _expected(err: dict[str, Any]) -> str:
    kind = err["type"]
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    msg = str(err["msg"])
    for prefix in ("Input should be ", "Value should be "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg[:1].lower() + msg[1:]


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def format_validation_error(
    exc: ValidationError, data: dict[str, Any], source: str, overridden: set[str] | None = None
) -> str:
    """One line per problem: ``key.path: got VALUE; expected WHAT`` under a ``FILE:`` header."""
    overridden = overridden or set()
    count = exc.error_count()
    lines = [f"{source}: invalid recipe ({count} problem{'s' * (count > 1)})"]
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "<top level>"
        from_set = any(o == key or o.startswith(key + ".") for o in overridden)
        origin = " (from --set)" if from_set and loc else ""
        kind = err["type"]
        if kind == "extra_forbidden":
            owner = _model_at(loc)
            hint = ""
            if owner is not None:
                allowed = list(owner.model_fields)
                close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
                parent = ".".join(str(p) for p in loc[:-1])
                if close:
                    suggestion = f"{parent}.{close[0]}" if parent else close[0]
                    hint = f"; did you mean '{suggestion}'?"
                where = f"under [{parent}]" if parent else "at the top level"
                hint += f" (allowed keys {where}: {', '.join(allowed)})"
            lines.append(f"  {key}{origin}: unknown key{hint}")
        elif kind == "missing":
            info = _field_info(loc)
            what = f" ({info.description})" if info is not None and info.description else ""
            lines.append(f"  {key}: required key is missing{what}")
        elif kind in ("value_error", "assertion_error") and not loc:
            # Cross-field checks (e.g. a role naming an undefined policy) carry their own key
            # path and expectation in the message.
            msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
            lines.append(f"  {msg}")
        else:
            value = _lookup(data, loc)
            if value is _MISSING:
                value = err.get("input")
            if kind == "value_error":
                msg = str(err["msg"]).removeprefix("Value error, ")
                lines.append(f"  {key}{origin}: got {_show(value)}; {msg}")
            else:
                lines.append(f"  {key}{origin}: got {_show(value)}; expected {_expected(err)}")
    return "\n".join(lines)


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override (``--set``) and validate a TOML recipe; every failure is a RecipeError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe file not found") from None
    except UnicodeDecodeError as exc:
        raise RecipeError(
            f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML: {exc}") from None
    return recipe_from_dict(
        anchor_paths(data, path.parent), overrides, source=str(path), overrides_base=Path.cwd()
    )


#: (section path, key) of the input files a recipe names; "*" is every entry of a table or list
_INPUT_PATHS = (
    (("policies", "*", "trainer"), "accelerate_config"),
    (("tasks", "sets", "*", "kwargs"), "path"),
    (("tasks", "sets", "*", "kwargs"), "data_dir"),
    (("security",), "cert_file"),
    (("security",), "key_file"),
    (("security",), "ca_file"),
)


def _anchor(value: Any, base: Path) -> Any:
    if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
        return value
    return str((base / value).resolve())


def _tables(node: Any, keys: tuple[str, ...]) -> list[dict]:
    if not keys:
        return [node] if isinstance(node, dict) else []
    head, rest = keys[0], keys[1:]
    if head == "*":
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
        )
        return [t for child in children for t in _tables(child, rest)]
    return _tables(node.get(head), rest) if isinstance(node, dict) else []


def anchor_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative input files of a recipe file resolve against the recipe's folder, not the working
    directory: a recipe beside its data (``sets = [{ name = "jsonl", kwargs = { path =
    "train.jsonl" } }]``, ``agent = "agent.py:run"``) runs from anywhere. A local model path
    counts when it exists there (``org/name`` may be a hub id). Outputs (``run.output_dir``,
    ``dataflow.store``) and ``--set`` values stay relative to the working directory."""
    base = base.resolve()
    for keys, key in _INPUT_PATHS:
        for table in _tables(data, keys):
            if key in table:
                table[key] = _anchor(table[key], base)
    wf = data.get("workflow")
    if isinstance(wf, dict) and isinstance(wf.get("agent"), str):
        where, sep, fn = wf["agent"].rpartition(":")
        if sep and where.endswith(".py"):
            wf["agent"] = f"{_anchor(where, base)}:{fn}"
    names = data.get("policies") if isinstance(data.get("policies"), dict) else {}
    for policy in _tables(data, ("policies", "*")):
        for key in ("model", "base"):  # a base may also name a policy: that is no path
            model = policy.get(key)
            if (
                isinstance(model, str)
                and ":" not in model
                and not (key == "base" and model in names)
                and (base / model).exists()
            ):
                policy[key] = _anchor(model, base)
    return data


def recipe_from_dict(
    data: dict[str, Any],
    overrides: list[str] | None = None,
    source: str = "<recipe>",
    overrides_base: Path | None = None,
) -> Recipe:
    """Validate already-parsed recipe data (after applying ``overrides``).

    With ``overrides_base`` (the working directory, for ``--set`` on the command line), input
    files the overrides name are made absolute against it, as the recipe's own are against its
    folder: the run directory's copy of the recipe, which every service (and a node joining from
    another machine through ``GET /recipe``) loads, then names the file the user meant."""
    overrides = list(overrides or [])
    try:
        data = apply_overrides(data, overrides)
    except RecipeError as exc:
        raise RecipeError(f"{source}: {exc}") from None
    if overrides and overrides_base is not None:
        data = anchor_paths(data, overrides_base)  # the recipe's own are absolute already
    overridden = {".".join(parse_override(o)[0]) for o in overrides}
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, data, source, overridden)) from None


def recipe_to_toml(recipe: Recipe) -> str:
    """Render the fully resolved recipe (defaults filled in) as TOML that loads back to it.

    Schema sections become ``[tables]``, lists of sections ``[[arrays of tables]]``, free-form
    dicts (kwargs, roles) inline tables; unset optional keys (None) are left out.
    """
    blocks: list[str] = []
    _render_model(recipe, recipe.model_dump(mode="json"), [], blocks)
    return "\n\n".join(b for b in blocks if b.strip()) + "\n"


def _render_model(model: BaseModel, dumped: dict[str, Any], path: list[str], blocks: list[str]):
    header = blocks[-1] if blocks else None
    scalars: list[str] = []
    later: list[tuple[str, Any, Any]] = []
    for name in type(model).model_fields:
        value, plain = getattr(model, name), dumped.get(name)
        if plain is None:
            continue
        if isinstance(value, BaseModel) or (
            isinstance(value, dict)
            and value
            and all(isinstance(v, BaseModel) for v in value.values())
        ):
            later.append(("table", name, value))
        elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            later.append(("array", name, value))
        else:
            scalars.append(f"{_key(name)} = {_toml_value(plain)}")
    body = "\n".join(scalars)
    if header is not None and header.startswith("["):
        blocks[-1] = header + ("\n" + body if body else "")
    elif body:
        blocks.append(body)
    for kind, name, value in later:
        sub_path = [*path, _key(name)]
        if kind == "table" and isinstance(value, BaseModel):
            blocks.append(f"[{'.'.join(sub_path)}]")
            _render_model(value, dumped[name], sub_path, blocks)
        elif kind == "table":
            for sub, item in value.items():
                item_path = [*sub_path, _key(sub)]
                blocks.append(f"[{'.'.join(item_path)}]")
                _render_model(item, dumped[name][sub], item_path, blocks)
        else:
            for item, plain in zip(value, dumped[name], strict=True):
                blocks.append(f"[[{'.'.join(sub_path)}]]")
                _render_model(item, plain, sub_path, blocks)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        items = [f"{_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    raise TypeError(f"cannot render {type(v).__name__} as TOML")


def _toml_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else _toml_string(k)
