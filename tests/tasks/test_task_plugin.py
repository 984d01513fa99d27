"""A third-party package brings its own env and its own task set through entry points only, and
`astraflow train` trains on them; `recipe check` validates rows against the env.

The package (tests/tasks/plugin_pkg) is "installed" the way pip installs a wheel: its files and a
dist-info folder (METADATA plus the entry points read from the package's own pyproject.toml) in a
site folder on PYTHONPATH. importlib.metadata finds entry points there exactly as in site-packages,
with no virtualenv and no network, so this runs the same in CI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SRC = Path(__file__).parent / "plugin_pkg"
CLI = [sys.executable, "-m", "astraflow.cli.main"]

RECIPE = """
[run]
name = "acme"
max_steps = 2

[policies.policy]
model = "builtin:tiny-arith"
sampling = {{ temperature = 1.0, max_tokens = 4 }}
trainer = {{ groups_per_step = 2, checkpoint_every = 2, learning_rate = 1e-4 }}

[tasks]
env = "acme/Double-v0"
group_size = 4
sets = [{sets}]

[rollout]
concurrency = 16

[evaluation]
every_steps = 0
"""


def install_plugin(src: Path, site: Path) -> None:
    """What ``pip install`` leaves behind: the package and its dist-info with entry_points.txt."""
    meta = tomllib.loads((src / "pyproject.toml").read_text())["project"]
    shutil.copytree(src / "acme_tasks", site / "acme_tasks")
    dist = site / f"{meta['name'].replace('-', '_')}-{meta['version']}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n"
    )
    lines = []
    for group, eps in meta["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in eps.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    install_plugin(PLUGIN_SRC, site)
    return site


def _run(args: list[str], site: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "200",
    }
    return subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _recipe(tmp_path: Path, sets: str) -> Path:
    path = tmp_path / "acme.toml"
    path.write_text(RECIPE.format(sets=sets))
    return path


def test_tasks_list_and_show_find_the_plugin_set(site):
    out = _run([*CLI, "tasks", "list", "--json"], site)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["acme_doubles"]["source"] == "acme-tasks"
    assert rows["acme_doubles"]["splits"] == ["train", "test"]
    assert rows["acme_doubles"]["default_env"] == "acme/Double-v0"
    assert rows["arith"]["source"] == "astraflow"
    shown = _run([*CLI, "tasks", "show", "acme_doubles", "--split", "test", "--json"], site)
    assert shown.returncode == 0, shown.stderr
    got = json.loads(shown.stdout)
    assert got["split"] == "test" and len(got["rows"]) == 3
    assert got["rows"][0]["id"] == "acme-test-0" and isinstance(got["rows"][0]["number"], int)


def test_recipe_check_validates_rows_against_the_plugin_env(site, tmp_path):
    ok = _run([*CLI, "recipe", "check", str(_recipe(tmp_path, '{ name = "acme_doubles" }'))], site)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # a JSONL file whose second row lacks the env's field: named set, row and field
    rows = tmp_path / "doubles.jsonl"
    rows.write_text('{"number": 3}\n{"numbr": 4, "id": "typo"}\n')
    sets = f'{{ name = "jsonl", kwargs = {{ path = {json.dumps(str(rows))} }} }}'
    bad = _run([*CLI, "recipe", "check", str(_recipe(tmp_path, sets))], site)
    assert bad.returncode == 1
    err = " ".join(bad.stderr.split())
    assert "tasks.sets[0] 'jsonl' (split 'train') row 1 (id 'typo')" in err
    assert "missing field(s) 'number'" in err and "acme/Double-v0" in err


@pytest.mark.slow
def test_astraflow_train_on_plugin_env_and_task_set(site, tmp_path):
    recipe = _recipe(tmp_path, '{ name = "acme_doubles" }')
    out = _run(
        [*CLI, "train", str(recipe), "--no-live", "--set",
         f"run.output_dir={json.dumps(str(tmp_path / 'runs'))}"],
        site,
        timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = (tmp_path / "runs" / "acme" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if r.get("type") == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["samples"] > 0 for r in steps)
    # the tasks trained on are the plugin's, run in the plugin's env
    from astraflow.dataflow.storage import history, store

    with store.read_only(tmp_path / "runs" / "acme" / "dataflow.db") as tx:
        ids = [t.id for t in history.tasks(tx)]
    assert ids and all(i.startswith("acme_doubles:train:") for i in ids)

    # `eval run` scores the run directory's latest checkpoint on the plugin's held-out split
    report = tmp_path / "eval.json"
    ev = _run(
        [*CLI, "eval", "run", "--policy", str(tmp_path / "runs" / "acme"), "--env",
         "acme/Double-v0", "--tasks", "acme_doubles:test", "--limit", "4", "--max-tokens", "4",
         "--device", "cpu", "--out", str(report)],
        site,
        timeout=300,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stdout[-3000:] + ev.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["meta"]["weight_version"] == 2
    assert "checkpoint-2" in got["meta"]["checkpoint"]
    assert got["meta"]["sampling"]["temperature"] == 0.0
    assert got["summary"]["tasks"] == 4 and got["summary"]["errors"] == 0
    assert all(r["versions"] == [2] for r in got["samples"])
