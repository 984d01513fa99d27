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
