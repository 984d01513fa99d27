"""Bounded scalar and container types for values that arrive from untrusted callers.

Why here, in the protocol types: a rollout node is untrusted, and every value it sends is checked
once, at the door, by the type that carries it (not by checks sprinkled over handlers). A value
that passes is safe to store (SQLite integers are int64; text is UTF-8), to encode back (msgpack
and JSON cannot carry ints past 64 bits or lone surrogates) and to compute with (finite rewards).
Every limit is a named constant, and the 422 names it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from astraflow.recipe.schema import MAX_NODES_DEFAULT

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Longest name (policy, role, node name, region, id) accepted on the wire.
MAX_NAME_CHARS = 256
#: Deepest nesting of a free-form field (``meta``, ``info``, task payloads).
MAX_NESTING = 16
#: Most scalar leaves plus containers in one free-form field.
MAX_TREE_ITEMS = 10_000
#: Longest string inside a free-form field.
MAX_TREE_STRING_CHARS = 65_536
#: Most policies one node registration may name.
MAX_POLICIES = 64
#: Most nodes registered (active) at once by default (``dataflow.max_nodes`` sets it per run):
#: the node token is shared by every node of a run, so this bounds the registrations one token
#: can make.
MAX_NODES = MAX_NODES_DEFAULT
#: Most lease ids a heartbeat may report in flight.
MAX_IN_FLIGHT = 8192
#: Most metric keys one heartbeat or batch ack may carry (more are a 422; unknown keys within
#: the bound are dropped and counted by the service, see :mod:`astraflow.protocol.node_metrics`).
MAX_METRIC_KEYS = 256


def utf8(value: str) -> str:
    """Refuse strings that are not valid UTF-8 (lone surrogates) instead of failing at encode."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"string is not valid UTF-8 (lone surrogate at position {exc.start})"
        ) from None
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")
    return value


def _tree(value: Any) -> Any:
    """A free-form JSON-like value, bounded in depth, size, ints, floats and strings."""
    items = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        items += 1
        if items > MAX_TREE_ITEMS:
            raise ValueError(f"more than {MAX_TREE_ITEMS} items (limit MAX_TREE_ITEMS)")
        if depth > MAX_NESTING:
            raise ValueError(f"nested deeper than {MAX_NESTING} levels (limit MAX_NESTING)")
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise ValueError(f"keys must be strings, got {type(key).__name__}")
                stack.append((key, depth + 1))
                stack.append((child, depth + 1))
        elif isinstance(node, (list, tuple)):
            stack.extend((child, depth + 1) for child in node)
        elif isinstance(node, str):
            if len(node) > MAX_TREE_STRING_CHARS:
                raise ValueError(
                    f"a string of {len(node)} characters exceeds {MAX_TREE_STRING_CHARS}"
                )
            utf8(node)
        elif isinstance(node, bool) or node is None:
            continue
        elif isinstance(node, int):
            if not INT64_MIN <= node <= INT64_MAX:
                raise ValueError(f"integer {node} is outside int64")
        elif isinstance(node, float):
            _finite(node)
        elif isinstance(node, (bytes, bytearray)):
            continue
        else:
            raise ValueError(f"unsupported value of type {type(node).__name__}")
    return value


#: A 64-bit signed integer (what SQLite and msgpack store).
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
#: A weight version or step: 0..int64 max.
Version = Annotated[int, Field(ge=0, le=INT64_MAX)]
#: A finite float (rewards, metrics): NaN and infinities are refused at the door.
Finite = Annotated[float, AfterValidator(_finite)]
#: A short identifier-like string: valid UTF-8, at most MAX_NAME_CHARS characters.
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS), AfterValidator(utf8)]
#: A free-form field (``meta``, ``info``, payloads): bounded depth and size, plain JSON values.
Tree = Annotated[dict[str, Any], AfterValidator(_tree)]


def text(max_chars: int) -> Any:
    """A string of at most ``max_chars`` characters that is valid UTF-8."""
    return Annotated[str, Field(max_length=max_chars), AfterValidator(utf8)]
