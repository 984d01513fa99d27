"""Dependency direction: envs are used by the rollout component, never the other way round;
launchers and the CLI reach services only through the typed client.

Why a test: the AgentBench evaluation once lived in ``envs/`` and imported rollout internals; the
evaluation now runs on the rollout side (``astraflow.rollout.evaluation``). Every import in every
module under ``envs/`` is read (function-level ones included), so a regression is named by file.
"""

from __future__ import annotations

import ast
import re
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


def test_each_component_has_one_process_entry_shaped_alike():
    """``astraflow/{dataflow,rollout,trainer}/main.py`` each define an options dataclass and a
    ``run_*`` function (docs/architecture.md, "Components"); the CLI calls nothing else to start
    a component's process. Why a test: the entries were once named three ways (``server.py``,
    ``service.py``, ``wiring.py``)."""
    shapes = {}
    for component in ("dataflow", "rollout", "trainer"):
        tree = ast.parse((REPO / "astraflow" / component / "main.py").read_text(encoding="utf-8"))
        options = [
            n.name
            for n in tree.body
            if isinstance(n, ast.ClassDef)
            and n.name.endswith("Options")
            and any(getattr(d, "id", None) == "dataclass" for d in n.decorator_list)
        ]
        runs = [
            n.name
            for n in tree.body
            if isinstance(n, ast.FunctionDef)
            and n.name.startswith("run_")
            and n.args.args
            and n.args.args[0].annotation is not None
            and ast.unparse(n.args.args[0].annotation) in options
        ]
        shapes[component] = (len(options), len(runs))
    assert shapes == {c: (1, 1) for c in ("dataflow", "rollout", "trainer")}
    serve = (REPO / "cli" / "serve.py").read_text(encoding="utf-8")
    for old in ("dataflow.server", "rollout.service", "trainer.service", "trainer.wiring"):
        assert f"astraflow.{old}" not in serve


#: Statements of SQL as they are written in the dataflow service (string literals and f-strings).
_SQL = re.compile(
    r"\b(SELECT\s.*\bFROM|INSERT\s+(OR\s+\w+\s+)?INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM"
    r"|SAVEPOINT|ROLLBACK|RELEASE\s+\w|PRAGMA|BEGIN\s+IMMEDIATE|CREATE\s+(TABLE|INDEX))\b"
)
_CURSOR_CALLS = {"execute", "executemany", "executescript"}


def _sql_sites(path: Path) -> list[str]:
    """Lines of ``path`` that run a statement on a connection (``.execute(...)`` and its
    siblings) or hold a string that reads as SQL (what ``tx.one``/``tx.scalar`` would run)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _CURSOR_CALLS
        ):
            found.append(f"{node.lineno}: .{node.func.attr}(")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _SQL.search(node.value)
        ):
            found.append(f"{node.lineno}: {node.value[:60]!r}")
    return found


def test_dataflow_sql_lives_in_the_storage_package_and_the_store():
    """One storage module owns the SQL (docs/decisions.md, "Dataflow SQL in a storage package"):
    the statements on each table are functions in ``astraflow/dataflow/storage/``, the schema,
    meta table and transaction control are in ``store.py``; the domain modules (leases, ingest,
    batching, policies, ...) call them. Why a test: the statements had spread over up to six
    modules per table, so a schema change had to find them all."""
    root = REPO / "astraflow" / "dataflow"
    bad = [
        f"{path.relative_to(REPO)}:{site}"
        for path in sorted(root.rglob("*.py"))
        if path.parent.name != "storage" and path != root / "store.py"
        for site in _sql_sites(path)
    ]
    assert bad == []


def test_the_sql_scan_sees_statements_and_cursor_calls(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text(
        "def f(tx, t):\n"
        "    tx.one('SELECT 1 FROM groups WHERE id=?', (1,))\n"
        "    tx.conn.executemany(q, rows)\n"
        "    tx.scalar(f'SELECT COUNT(*) FROM {t} WHERE x=?')\n"
        "    route = ('DELETE', '/nodes/{node_id}')\n"
    )
    sites = _sql_sites(probe)
    assert sorted(s.split(":")[0] for s in sites) == ["2", "3", "4"], sites
