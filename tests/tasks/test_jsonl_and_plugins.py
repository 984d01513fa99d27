"""The built-in ``jsonl`` task set and the registry's handling of ``astraflow.tasks`` plugins."""

from __future__ import annotations

import json
import sys

import pytest
from astraflow.tasks.base import TaskSetInfo, TaskSetRegistry
from astraflow.tasks.catalog import add_plugins, builtin_task_sets, load_task_set


def test_jsonl_rows_are_payloads_with_ids(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text('{"q": "a", "key": 7}\n\n{"q": "b"}\n')
    rows = load_task_set("jsonl", "train", path=str(tmp_path / "{split}.jsonl"), id_field="key")
    assert rows == [{"q": "a", "key": 7, "id": "7"}, {"q": "b", "id": "1"}]
    assert [r["id"] for r in load_task_set("jsonl", "train", path=str(f))] == ["0", "1"]


def test_jsonl_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="needs kwargs.path"):
        load_task_set("jsonl", "train")
    with pytest.raises(FileNotFoundError, match="test.jsonl"):
        load_task_set("jsonl", "test", path=str(tmp_path / "{split}.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: each row must be a JSON object"):
        load_task_set("jsonl", "train", path=str(bad))


def _fake_entry_points(tmp_path, monkeypatch, body: str, eps: str) -> None:
    (tmp_path / "fake_sets.py").write_text(body)
    dist = tmp_path / "fake_sets-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-sets\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[astraflow.tasks]\n{eps}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_sets", raising=False)


def test_plugins_register_and_broken_ones_are_reported(tmp_path, monkeypatch):
    body = (
        "from astraflow.tasks.base import TaskSetInfo\n"
        "ONE = TaskSetInfo('one', lambda split, seed=0: [{'id': split}], ('train',))\n"
        "def clash():\n"
        "    return [TaskSetInfo('arith', lambda split, seed=0: [], ('train',))]\n"
        "def wrong():\n"
        "    return ['not a set']\n"
    )
    eps = (
        "one = fake_sets:ONE\nclash = fake_sets:clash\nwrong = fake_sets:wrong\n"
        "missing = fake_sets:nope"
    )
    _fake_entry_points(tmp_path, monkeypatch, body, eps)
    reg = builtin_task_sets()
    add_plugins(reg)
    assert reg.info("one").source == "fake-sets"
    assert reg.load("one", "train") == [{"id": "train"}]
    assert reg.info("arith").source == "astraflow"  # a plugin cannot replace a built-in
    assert "registered twice: by astraflow and by fake-sets" in reg.errors["clash"]
    assert "expected TaskSetInfo objects" in reg.errors["wrong"]
    assert "'missing' (fake_sets:nope) failed: AttributeError" in reg.errors["missing"]


def test_unknown_set_suggests_a_close_name():
    reg = TaskSetRegistry()
    reg.add(TaskSetInfo("acme_doubles", lambda split, seed=0: [], ("train",)))
    with pytest.raises(KeyError, match="did you mean acme_doubles"):
        reg.info("acme_double")


def test_recipe_check_reports_wrong_types_through_the_env_validator(tmp_path):
    from astraflow.tasks.check import check_sets

    from astraflow.recipe import load_recipe

    rows = tmp_path / "m.jsonl"
    rows.write_text(json.dumps({"question": "1+1", "answer": [2]}) + "\n")
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(
        '[policies.policy]\nmodel = "builtin:tiny-arith"\n[tasks]\nenv = "astraflow/Math-v0"\n'
        f'sets = [{{ name = "jsonl", kwargs = {{ path = {json.dumps(str(rows))} }} }}]\n'
        "[evaluation]\nevery_steps = 0\n"
    )
    (check,) = check_sets(load_recipe(recipe_file, []))
    assert check.error is not None
    assert "row 0 (id '0')" in check.error and "'answer'" in check.error
