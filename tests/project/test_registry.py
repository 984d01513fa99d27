"""The one registry behind envs, workflows, dataflow policies and task sets (astraflow/registry.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from astraflow.registry import DuplicateNameError, Registry, UnknownNameError, close_names


@dataclass(frozen=True)
class Item:
    name: str
    source: str = "here"


def _registry(**kwargs) -> Registry[Item]:
    return Registry("widget", lambda i: i.name, origin=lambda i: i.source, **kwargs)


def _fake_dist(tmp_path, monkeypatch, group: str, body: str, eps: str, module: str) -> None:
    """Install ``module`` (``body``) with ``eps`` under ``group`` as the distribution fake-dist."""
    (tmp_path / f"{module}.py").write_text(body)
    dist = tmp_path / "fake_dist-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{eps}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)


def test_a_taken_name_is_refused_unless_it_is_the_same_item():
    reg = _registry()
    reg.register(Item("a"))
    reg.register(Item("a"))  # the same item again (a built-in also published as a plugin)
    with pytest.raises(
        DuplicateNameError, match="widget 'a' is registered twice: by here and by x"
    ):
        reg.register(Item("a", "x"))
    reg.replace(Item("a", "x"))
    assert reg.get("a").source == "x"


def test_unknown_name_names_kind_close_names_known_names_and_failed_plugins():
    reg = _registry()
    for name in ("acme/Maze-v0", "astraflow/Math-v0", "zero"):
        reg.register(Item(name))
    with pytest.raises(UnknownNameError) as caught:
        reg.get("ACME/maze-v0")
    assert str(caught.value).startswith("unknown widget 'ACME/maze-v0'; did you mean acme/Maze-v0")
    assert str(caught.value).endswith("(known: acme/Maze-v0, astraflow/Math-v0, zero)")
    assert close_names("Maze-v0", reg.names())[0] == "acme/Maze-v0"  # without the namespace
    reg.errors["broken"] = "astraflow.widgets entry point 'broken' (m:f) failed: ImportError: x"
    with pytest.raises(
        UnknownNameError, match="plugins that failed to load: .*'broken'.*ImportError"
    ):
        reg.get("nothing-like-it")


def test_the_kind_chooses_its_unknown_name_exception():
    reg = Registry("thing", str, unknown_error=LookupError)
    with pytest.raises(LookupError, match="unknown thing 'x'"):
        reg.get("x")


def test_entry_points_are_discovered_lazily_and_broken_plugins_are_reported(tmp_path, monkeypatch):
    body = (
        "class Item:\n"
        "    def __init__(self, name):\n"
        "        self.name = name\n"
        "def good():\n"
        "    return [Item('one'), 'not an item', Item('two')]\n"
        "def clash():\n"
        "    return [Item('builtin')]\n"
        "def boom():\n"
        "    raise RuntimeError('no network')\n"
    )
    eps = "good = fake_widgets:good\nclash = fake_widgets:clash\nboom = fake_widgets:boom\n"
    eps += "missing = fake_widgets:nope"
    _fake_dist(tmp_path, monkeypatch, "test.widgets", body, eps, "fake_widgets")

    def accept(obj, ep):
        if not hasattr(obj, "name"):
            raise TypeError(f"expected Item objects, got {type(obj).__name__}")
        return Item(obj.name, ep.dist)

    reg = _registry(
        group="test.widgets", builtins=lambda: [Item("builtin", "astraflow")], accept=accept
    )
    assert reg.errors == {}  # nothing loaded before first use
    assert reg.names() == ["builtin", "one", "two"]  # one bad item does not hide the others
    assert reg.get("one").source == "fake-dist"
    assert (
        "'good' (fake_widgets:good) failed: TypeError: expected Item objects" in reg.errors["good"]
    )
    assert "registered twice: by astraflow and by fake-dist" in reg.errors["clash"]
    assert "'boom' (fake_widgets:boom) failed: RuntimeError: no network" in reg.errors["boom"]
    assert "'missing' (fake_widgets:nope) failed: AttributeError" in reg.errors["missing"]


def test_a_policy_plugin_cannot_replace_a_builtin_policy(tmp_path, monkeypatch):
    from astraflow.dataflow.policies import PolicyRegistry

    body = (
        "from astraflow.dataflow.policies.selection import FifoOrder\n"
        "class MyFifo(FifoOrder):\n"
        "    pass\n"
        "def policies():\n"
        "    return [MyFifo, int]\n"
    )
    _fake_dist(tmp_path, monkeypatch, "test.policies", body, "mine = fake_pol:policies", "fake_pol")
    reg = PolicyRegistry(group="test.policies")
    assert reg.get("fifo").__name__ == "FifoOrder"
    assert "dataflow policy 'fifo' is registered twice" in reg.errors["mine"]
    assert "expected DataflowPolicy subclasses" in reg.errors["mine"]


def test_a_workflow_function_plugin_is_named_after_its_entry_point(tmp_path, monkeypatch):
    from astraflow.rollout.workflows import WorkflowRegistry

    body = (
        "async def debate(task, policies, make_env):\n"
        '    """Two agents argue, a judge scores."""\n'
        "debate.roles = ('pro', 'con', 'judge')\n"
    )
    _fake_dist(tmp_path, monkeypatch, "test.workflows", body, "debate = fake_wf:debate", "fake_wf")
    spec = WorkflowRegistry(group="test.workflows").discover().get("debate")
    assert (spec.roles, spec.description, spec.source) == (
        ("pro", "con", "judge"),
        "Two agents argue, a judge scores.",
        "fake-dist",
    )
