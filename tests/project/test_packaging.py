"""One `astraflow` distribution: a built wheel holds every package, its data and the console script.

The wheel is built from a copy of the tree (so concurrent builds never share a build/ folder) and
then installed, non-editable, into a folder of its own to prove `pip install .` works and puts one
top-level package, ``astraflow``, into site-packages (``envs/``, ``tasks/`` and ``cli/`` install as
``astraflow.envs``, ``astraflow.tasks`` and ``astraflow.cli``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: repository folder -> the import name it installs as (setup.py's mapping)
PACKAGES = {
    "astraflow": "astraflow",
    "envs": "astraflow/envs",
    "tasks": "astraflow/tasks",
    "cli": "astraflow/cli",
}
TOP_LEVEL = {
    "astraflow",
    "envs",
    "tasks",
    "recipes",
    "cli",
    "tests",
    "bench",
    "pyproject.toml",
    "setup.py",
    "README.md",
}
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


def expected_packages() -> set[str]:
    """Every package folder of the repository, as the path it takes inside the wheel."""
    return {
        str(Path(installed) / init.parent.relative_to(REPO / folder))
        for folder, installed in PACKAGES.items()
        for init in (REPO / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def expected_package_data() -> set[str]:
    builtin = REPO / "astraflow" / "models" / "builtin"
    if not builtin.is_dir():
        return set()
    return {
        str(p.relative_to(REPO))
        for pattern in ("*.json", "*.safetensors")
        for p in builtin.rglob(pattern)
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in (*PACKAGES, "pyproject.toml", "setup.py", "README.md", "LICENSE"):
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=IGNORE)
        elif path.exists():
            shutil.copy2(path, src / name)
    # A probe model folder (hyphenated, no __init__.py, like the real built-in models) proves the
    # package-data rules ship such files even before any real model is committed.
    probe = src / "astraflow" / "models" / "builtin" / "probe-model"
    probe.mkdir(parents=True, exist_ok=True)
    (probe / "config.json").write_text("{}")
    (probe / "model.safetensors").write_bytes(b"\0" * 8)
    out = work / "dist"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (built,) = out.glob("astraflow-*.whl")
    return built


def test_top_level_layout():
    names = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}
    assert TOP_LEVEL <= names, TOP_LEVEL - names
    allowed = TOP_LEVEL | {"docs", "LICENSE", "build", "dist", "runs", "astraflow.egg-info"}
    assert names <= allowed, f"unexpected top-level entries: {sorted(names - allowed)}"
    assert "Apache License" in (REPO / "LICENSE").read_text()[:200]


def test_wheel_contains_every_package_and_its_data(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        metadata = zf.read(f"{dist_info}/METADATA").decode()
    packages = {str(Path(n).parent) for n in names if n.endswith("/__init__.py")}
    missing = expected_packages() - packages
    assert not missing, f"packages missing from the wheel: {sorted(missing)}"
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"astraflow"}, f"top-level names besides astraflow: {sorted(top_level)}"
    probe = {
        f"astraflow/models/builtin/probe-model/{f}" for f in ("config.json", "model.safetensors")
    }
    data_missing = (expected_package_data() | probe) - names
    assert not data_missing, f"package data missing from the wheel: {sorted(data_missing)}"
    assert not any(n.startswith(("recipes/", "tests/")) for n in names)
    assert "astraflow = astraflow.cli.main:main" in entry_points
    assert "[astraflow.envs]" in entry_points
    assert "Requires-Dist: torch==2.13.0" in metadata
    # imported by the package, so declared (not just pulled in by trl/transformers)
    assert "Requires-Dist: datasets" in metadata and "Requires-Dist: huggingface_hub" in metadata
    assert "astraflow/py.typed" in names  # type checkers read the package's annotations
    for extra in ("vllm", "ray", "docker", "test", "dev"):
        assert f"Provides-Extra: {extra}" in metadata


def test_non_editable_install_runs_from_site_packages(wheel: Path, tmp_path: Path):
    """Install the wheel (no deps: they are this interpreter's, venv or not) into a folder of its
    own, then import from there and run the console script: the generic names ``envs``, ``tasks``
    and ``cli`` are not importable, their modules are under ``astraflow``."""
    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    assert not {"envs", "tasks", "cli"} & {p.name for p in target.iterdir()}
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(target)}
    probe = (
        "import importlib.util as u, astraflow.cli.main, astraflow.envs, astraflow.tasks, "
        "astraflow.protocol as p; print(p.__file__); "
        "print([n for n in ('envs', 'tasks', 'cli') if u.find_spec(n)])"
    )
    where = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    module_file, generic = where.stdout.splitlines()
    assert module_file.startswith(str(target)), where.stdout
    assert generic == "[]", f"generic top-level packages importable: {generic}"
    script = subprocess.run(
        [sys.executable, "-c", "from astraflow.cli.main import main; main()", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert script.returncode == 0, script.stderr[-3000:]
    assert "recipe" in script.stdout


def test_readme_and_ci_run_the_same_test_command():
    """README's two set-up commands exist, and CI runs exactly the README's test command."""
    readme = (REPO / "README.md").read_text()
    install = 'pip install torch==2.13.0 && pip install -e ".[dev]"'
    assert f"{install} && astraflow train recipes/quickstart.toml" in readme
    assert f"{install} && bash .ci/test.sh" in readme
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash .ci/test.sh" in ci and "set -euo pipefail" in ci
    assert "torch==2.13.0" in ci and '".[dev]"' in ci
    for script in (".ci/run", ".ci/test.sh"):
        check = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_every_test_module_has_a_basename_of_its_own():
    """Test folders are not packages, so pytest imports each file by its basename: two files of one
    name in different folders stop the whole collection ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(path.relative_to(REPO).as_posix())
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
