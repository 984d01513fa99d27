"""Loading, overriding and validating recipes, with errors a person can act on.

Every error names the file, the dotted key path, the offending value and what was expected; an
unknown key also gets a "did you mean" suggestion drawn from the schema.
"""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from astraflow.recipe.schema import Recipe


class RecipeError(ValueError):
    """A recipe that cannot be used; the message is meant to be shown as is."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as a TOML literal when it is one, else as a string."""
    if "=" not in text:
        raise RecipeError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise RecipeError(f"override {text!r} has an empty key segment")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise RecipeError(f"override {text!r}: {part!r} is a value, not a table")
            node = nxt
        node[path[-1]] = value
    return data


def _schema_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that owns the key at ``loc[:-1]`` (for did-you-mean on unknown keys)."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            ann = field.annotation
            current = _unwrap(ann)
        elif isinstance(part, (int, str)):
            continue
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(ann: Any) -> Any:
    args = getattr(ann, "__args__", ())
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in reversed(args):
        inner = _unwrap(a)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return ann


def _lookup(data: Any, loc: tuple) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def format_validation_error(exc: ValidationError, data: dict[str, Any], source: str) -> str:
    lines = [f"{source}: invalid recipe ({exc.error_count()} problem{'s' * (exc.error_count() > 1)})"]
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "<top level>"
        kind = err["type"]
        if kind == "extra_forbidden":
            owner = _schema_at(Recipe, loc)
            hint = ""
            if owner is not None:
                close = difflib.get_close_matches(str(loc[-1]), list(owner.model_fields), n=1)
                if close:
                    hint = f"; did you mean '{'.'.join(str(p) for p in loc[:-1] + (close[0],))}'?"
                else:
                    hint = f"; allowed keys here: {', '.join(owner.model_fields)}"
            lines.append(f"  {key}: unknown key{hint}")
        elif kind == "missing":
            lines.append(f"  {key}: required key is missing")
        else:
            value = _lookup(data, loc)
            shown = repr(value) if value is not None else repr(err.get("input"))
            lines.append(f"  {key}: got {shown[:80]}; expected {err['msg'].lower()}")
    return "\n".join(lines)


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe file not found") from None
    except OSError as exc:
        raise RecipeError(f"{path}: cannot read recipe: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML: {exc}") from exc
    return recipe_from_dict(data, overrides, source=str(path))


def recipe_from_dict(data: dict[str, Any], overrides: list[str] | None = None, source: str = "<recipe>") -> Recipe:
    data = apply_overrides(data, list(overrides or []))
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, data, source)) from None


def recipe_to_toml(recipe: Recipe) -> str:
    """Render the fully resolved recipe (defaults filled in) as TOML."""
    data = recipe.model_dump(mode="json", exclude_none=True)
    return _dump_toml(data)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot render {type(v).__name__} as TOML")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else _toml_value(k)


def _dump_toml(data: dict[str, Any], prefix: str = "") -> str:
    scalars, tables, arrays = [], [], []
    for k, v in data.items():
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()) and prefix == "" and k == "policies":
            tables.append((k, v, True))
        elif isinstance(v, dict) and any(isinstance(x, (dict, list)) for x in v.values()) or (isinstance(v, dict) and prefix == ""):
            tables.append((k, v, False))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays.append((k, v))
        else:
            scalars.append(f"{_key(k)} = {_toml_value(v)}")
    out = "\n".join(scalars)
    for k, v, nested in tables:
        name = f"{prefix}{_key(k)}"
        if nested:
            for sub, subv in v.items():
                out += f"\n\n[{name}.{_key(sub)}]\n" + _dump_toml(subv, f"{name}.{_key(sub)}.").lstrip("\n")
        else:
            out += f"\n\n[{name}]\n" + _dump_toml(v, f"{name}.").lstrip("\n")
    for k, v in arrays:
        name = f"{prefix}{_key(k)}"
        for item in v:
            out += f"\n\n[[{name}]]\n" + _dump_toml(item, f"{name}.").lstrip("\n")
    return out.strip("\n") + "\n"
