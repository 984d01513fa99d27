"""Dependency direction: envs are used by the rollout component, never the other way round;
launchers and the CLI reach services only through the typed client.

Why a test: the AgentBench evaluation once lived in ``envs/`` and imported rollout internals; the
evaluation now runs on the rollout side (``astraflow.rollout.evaluation``). Every import in every
module under ``envs/`` is read (function-level ones included), so a regression is named by file.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("astraflow.rollout",)


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def test_envs_import_nothing_from_the_rollout_component():
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in sorted((REPO / "envs").rglob("*.py"))
        for line, name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    ]
    assert bad == []


def test_the_scan_sees_function_level_imports(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("def f():\n    from astraflow.rollout.engines import make_engine\n")
    assert _imports(probe) == [(2, "astraflow.rollout.engines")]


def test_launchers_and_cli_reach_services_only_through_the_typed_client():
    """The launcher once read ``/status`` with raw httpx as an untyped dict; the typed client
    (``astraflow.protocol.client``) is the one way to talk to the dataflow service."""
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for folder in ("astraflow/launch", "cli")
        for path in sorted((REPO / folder).rglob("*.py"))
        for line, name in _imports(path)
        if name == "httpx" or name.startswith("httpx.")
    ]
    assert bad == []
