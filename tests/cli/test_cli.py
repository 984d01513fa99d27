"""The `astraflow` command: help for every group, no heavy imports, clear exits for stubs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from astraflow.cli.common import EXIT_UNAVAILABLE, unavailable
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
COMMANDS = [
    "train",
    "eval",
    "envs",
    "serve",
    "status",
    "recipe",
    "models",
    "report",
    "certs",
    "token",
]
HEAVY = ("torch", "transformers", "trl", "vllm", "ray", "cryptography")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def test_help_lists_every_command_with_one_line_help():
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for command in COMMANDS:
        line = next((ln for ln in lines if ln.strip("│ ").startswith(command + " ")), None)
        assert line is not None, f"{command} missing from --help:\n{result.stdout}"
        assert len(line.strip("│ ")[len(command) :].strip()) > 10, f"{command} has no help: {line}"


def test_cli_imports_no_heavy_libraries():
    """`astraflow --help` (and each group's help) must not pay for torch/transformers/trl."""
    code = (
        "import sys\n"
        "from astraflow.cli.main import app\n"
        f"for args in [['--help']] + [[c, '--help'] for c in {COMMANDS!r}]:\n"
        "    try:\n"
        "        app(args, prog_name='astraflow')\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (args, exc.code)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout.splitlines()[-1]


def test_unavailable_exits_2_with_a_clear_message():
    app = typer.Typer()

    @app.command()
    def later() -> None:
        unavailable("`serve dataflow`")

    result = CliRunner().invoke(app, [])
    assert result.exit_code == EXIT_UNAVAILABLE == 2
    assert "`serve dataflow` is not available in this build yet" in result.output


@pytest.mark.refused_before_start
def test_unknown_command_and_bad_recipe_exit_nonzero(tmp_path: Path):
    assert run_cli("no-such-command").returncode == 2
    bad = tmp_path / "bad.toml"
    bad.write_text('[policies.p]\nmodel = "m"\n[run]\nmax_steps = 0\n')
    result = run_cli("train", str(bad))
    assert result.returncode == 1
    assert "run.max_steps: got 0" in result.stderr
