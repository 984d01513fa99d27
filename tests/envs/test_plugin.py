"""A third-party package registers an env through the `astraflow.envs` entry point; AstraFlow's
CLI and plain Gymnasium find it with no change to this project.

The package (tests/envs/plugin_pkg) is "installed" by copying it to a temporary folder together
with the dist-info metadata pip would write, and putting that folder on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN_SRC = Path(__file__).parent / "plugin_pkg"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    shutil.copytree(PLUGIN_SRC / "acme_envs", site / "acme_envs")
    dist = site / "acme_envs-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-envs\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[astraflow.envs]\nacme = acme_envs:register\nbroken = acme_envs:no_such_function\n"
    )
    return site


def _run(args: list[str], site: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


def test_cli_lists_plugin_env_with_its_package(plugin_path):
    cli = [sys.executable, "-c", "from astraflow.cli.main import main; main()"]
    out = _run([*cli, "envs", "list", "--json"], plugin_path)
    assert out.returncode == 0, out.stderr
    rows = {r["id"]: r for r in json.loads(out.stdout)}
    assert rows["acme/Echo-v0"]["source"] == "acme-envs"
    assert rows["acme/Echo-v0"]["family"] == "acme"
    assert rows["astraflow/Math-v0"]["source"] == "astraflow"
    # a broken entry point is reported, and does not hide the others
    assert "env plugin broken failed to load" in out.stderr and "no_such_function" in out.stderr
    checked = _run([*cli, "envs", "check", "acme/Echo-v0", "--episodes", "2"], plugin_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok" in checked.stdout


def test_gymnasium_make_finds_plugin(plugin_path):
    code = (
        "import gymnasium as gym\n"
        "env = gym.make('astraflow.envs.autoregister:acme/Echo-v0')\n"
        "obs, _ = env.reset(seed=0, options={'task': {'word': 'delta'}})\n"
        "_, r, term, trunc, info = env.step('delta')\n"
        "print(obs, r, term, info['success'])\n"
    )
    out = _run([sys.executable, "-c", code], plugin_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["delta", "1.0", "True", "True"]


def test_without_plugin_the_id_is_unknown_with_suggestion():
    out = subprocess.run(
        [sys.executable, "-c", "from astraflow.cli.main import main; main()", "envs", "show", "astraflow/Math-v1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert "unknown env id 'astraflow/Math-v1'" in out.stderr
    assert "astraflow/Math-v0" in out.stderr
