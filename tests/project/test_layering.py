"""Dependency direction: envs are used by the rollout component, never the other way round;
launchers and the CLI reach services only through the typed client; the dataflow service's layers
(http -> ops -> storage) import downward only and form no import cycle.

Why a test: the AgentBench evaluation once lived in ``envs/`` and imported rollout internals; the
evaluation now runs on the rollout side (``astraflow.rollout.evaluation``). Every import in every
module under ``envs/`` is read (function-level ones included), so a regression is named by file.
"""

from __future__ import annotations

import ast
import graphlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("astraflow.rollout",)


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def _module_name(path: Path, root: Path) -> str:
    """``astraflow.dataflow.ops.leasing`` for ``root/astraflow/dataflow/ops/leasing.py``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported_modules(path: Path, root: Path, known: set[str]) -> list[tuple[int, str]]:
    """The modules of ``known`` that ``path`` imports, anywhere in it (function-level and
    ``TYPE_CHECKING`` imports included: a cycle through them is still a cycle in the design).

    ``from pkg import name`` names the module ``pkg.name`` when there is one, else ``pkg``;
    relative imports are resolved against the module's package."""
    here = _module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in known:
                    found.append((node.lineno, target))
                elif base in known:
                    found.append((node.lineno, base))
    return found


def _import_graph(package: Path, root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package tree it imports."""
    paths = sorted(package.rglob("*.py"))
    known = {_module_name(p, root) for p in paths}
    return {_module_name(p, root): {m for _, m in _imported_modules(p, root, known)} for p in paths}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as the list of modules round it), or None."""
    try:
        tuple(graph_sorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def graph_sorter(graph: dict[str, set[str]]) -> graphlib.TopologicalSorter:
    # a module importing itself (``from pkg import x`` inside pkg/__init__) is no cycle
    return graphlib.TopologicalSorter({m: deps - {m} for m, deps in graph.items()})


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
        if path.parent.name != "storage"
        for site in _sql_sites(path)
    ]
    assert bad == []


#: Test files that may hold SQL, and why: none of it is SQL of their own on the dataflow's store.
_SQL_IN_TESTS = {
    "tests/dataflow/test_store.py": "the store's own tests (schema, pragmas, migrations)",
    "tests/envs/test_agentbench_db.py": "the agent's SQL on AgentBench's dbbench databases",
    "tests/models/test_tiny_arith.py": "SQL text as tokenizer input",
    "tests/rollout/test_scripted_engine.py": "SQL text as a scripted completion",
    "tests/project/test_layering.py": "this scan's own probes",
}


def test_tests_benches_and_their_helpers_hold_no_sql():
    """Benches read a finished run from its ``metrics.jsonl`` (the dataflow's ``run_summary``
    record), a running one through ``GET /status``; tests, benches and their helpers read
    anything else through the storage functions (``storage.history`` for a run's rows; see
    docs/decisions.md, "A finished run is read from metrics.jsonl"): the store's schema is the
    dataflow's own, and a bench with SQL of its own broke silently when it changed."""
    root = REPO / "tests"
    bad = [
        f"{path.relative_to(REPO)}:{site}"
        for path in sorted(root.rglob("*.py"))
        if str(path.relative_to(REPO)) not in _SQL_IN_TESTS
        for site in _sql_sites(path)
    ]
    assert bad == []
    assert all((REPO / name).is_file() for name in _SQL_IN_TESTS), "a stale entry"


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


DATAFLOW = REPO / "astraflow" / "dataflow"

#: The dataflow service's layers, top down, and what each may import from the dataflow: its own
#: layer and the layers below. ``policies`` (pure data algorithms), ``config`` and ``errors`` are
#: the base every layer may use; ``main`` composes the process.
_LAYERS = {
    "main": {"main", "http", "ops", "storage", "policies", "base"},
    "http": {"http", "ops", "storage", "policies", "base"},
    "ops": {"ops", "storage", "policies", "base"},
    "storage": {"storage", "policies", "base"},
    "policies": {"policies", "base"},
    "base": {"base"},
}


def _layer(module: str) -> str:
    parts = module.split(".")[2:]  # after astraflow.dataflow
    if not parts or parts[0] in ("config", "errors"):
        return "base"
    return parts[0]


def test_every_dataflow_module_is_in_a_layer():
    modules = _import_graph(DATAFLOW, REPO)
    assert {_layer(m) for m in modules} <= set(_LAYERS), sorted(modules)


def test_dataflow_layers_import_downward_only():
    """http -> ops -> storage: the HTTP layer calls the operations, the operations call storage,
    never the other way round; storage knows nothing of operations or HTTP. Why a test: the
    service was one flat folder in which HTTP, operations and SQLite modules imported each other
    freely (docs/decisions.md, "Dataflow layers")."""
    bad = [
        f"{module} ({_layer(module)}) imports {target} ({_layer(target)})"
        for module, targets in sorted(_import_graph(DATAFLOW, REPO).items())
        for target in sorted(targets)
        if _layer(target) not in _LAYERS[_layer(module)]
    ]
    assert bad == []


def test_the_run_mode_is_a_leaf_of_the_operations():
    """The run mode decides (a gate, a batch plan, the round to start) and the operations act:
    ``ops/modes.py`` imports no other operation, so no call runs ops -> mode -> ops."""
    graph = _import_graph(DATAFLOW, REPO)
    ops = sorted(m for m in graph["astraflow.dataflow.ops.modes"] if _layer(m) == "ops")
    assert ops == []


#: Components and layers above the dataflow service: it serves them and imports none of them.
_ABOVE_THE_DATAFLOW = (
    "tasks",
    "envs",
    "cli",
    "astraflow.rollout",
    "astraflow.trainer",
    "astraflow.launch",
)


def test_the_dataflow_imports_nothing_from_the_components_above_it():
    """The task sets reach the dataflow as an injected task source (``cli/serve.py`` ->
    ``dataflow/main.py`` -> the feeder); the feeder once imported ``astraflow.tasks.catalog`` itself."""
    bad = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in sorted(DATAFLOW.rglob("*.py"))
        for line, name in _imports(path)
        if any(name == f or name.startswith(f + ".") for f in _ABOVE_THE_DATAFLOW)
    ]
    assert bad == []


def test_the_dataflow_has_no_import_cycle():
    assert _cycle(_import_graph(DATAFLOW, REPO)) is None


def test_the_import_graph_sees_lazy_relative_and_from_imports_and_finds_cycles(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import b\n")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from .. import c\n")
    (pkg / "c.py").write_text("import os\n")
    graph = _import_graph(pkg, tmp_path)
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.sub.b"},
        "pkg.c": set(),
        "pkg.sub": {"pkg.sub.b"},
        "pkg.sub.b": {"pkg.c"},
    }
    assert _cycle(graph) is None
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
    )
    cycle = _cycle(_import_graph(pkg, tmp_path))
    assert cycle is not None and {"pkg.a", "pkg.sub.b", "pkg.c"} <= set(cycle)


def test_each_dataflow_module_name_is_used_once():
    """A name means one thing in the service: ``storage.leases`` is the leases table and
    ``ops.leasing`` the operation, not ``leases.py`` twice (plus ``replays.py`` three times, as
    the service once had)."""
    names: dict[str, list[str]] = {}
    for path in sorted(DATAFLOW.rglob("*.py")):
        if path.name != "__init__.py":
            names.setdefault(path.stem, []).append(str(path.relative_to(DATAFLOW)))
    assert {n: paths for n, paths in names.items() if len(paths) > 1} == {}


def _positional_subscripts(path: Path) -> list[str]:
    """``name[3]`` and ``name[4:]`` (a local indexed by a number: how a positional row is read)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
            continue
        index = node.slice
        bounds = [index.lower, index.upper] if isinstance(index, ast.Slice) else [index]
        if any(isinstance(b, ast.Constant) and isinstance(b.value, int) for b in bounds):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_storage_rows_are_read_by_name_outside_storage():
    """Storage returns typed rows (NamedTuples such as ``storage.groups.GroupRow``) and builds the
    policies' views itself, so the operations and the HTTP layer read ``g.reward_mean``, never
    ``g[7]``. Why a test: ~110 positional reads once spelled out the column order of each query
    in the modules that called it, and ``GroupView(r[1], r[2], policy, r[3], ...)`` was written
    three times in two orders."""
    bad = [
        f"{path.relative_to(REPO)}:{site}"
        for layer in ("ops", "http")
        for path in sorted((DATAFLOW / layer).rglob("*.py"))
        for site in _positional_subscripts(path)
    ]
    assert bad == []


def test_the_positional_scan_sees_indexes_and_slices_of_locals(tmp_path):
    probe = tmp_path / "m.py"
    probe.write_text("def f(row, cfg):\n    return row[3], row[4:], cfg.sets[0], row[key], row.x\n")
    assert _positional_subscripts(probe) == ["2: row[3]", "2: row[4:]"]
