"""docs/security.md's limits are the code's: each row of its table names a constant and its
value, checked here against the module that defines it (a changed bound fails until the page
says the new one)."""

from __future__ import annotations

import re
from pathlib import Path

from astraflow.dataflow.ops import service
from astraflow.dataflow.storage import nodes
from astraflow.protocol import arrays, bounds, codec, messages, models

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
MODULES = (bounds, messages, arrays, models, codec, service, nodes)


def _table() -> dict[str, int]:
    rows = re.findall(r"^\| `([A-Z_]+)` \| (\d+) \|", DOC.read_text(encoding="utf-8"), re.M)
    return {name: int(value) for name, value in rows}


def _constant(name: str) -> int:
    found = [getattr(m, name) for m in MODULES if hasattr(m, name)]
    assert found, f"docs/security.md names {name}, which no module defines"
    return found[0]


def test_every_limit_on_the_page_is_the_codes():
    table = _table()
    assert {"MAX_NODES", "MAX_IN_FLIGHT", "MAX_METRIC_KEYS", "MAX_NESTING"} <= set(table)
    assert {name: _constant(name) for name in table} == table


def test_the_page_lists_the_kept_node_metrics():
    text = DOC.read_text(encoding="utf-8")
    missing = [k for k in sorted(messages.NODE_METRIC_KEYS) if f"`{k}`" not in text]
    assert missing == []
