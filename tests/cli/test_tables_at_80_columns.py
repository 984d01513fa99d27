"""`envs list` and `tasks list` fit an 80-column terminal: cells wrap, nothing is cut to '…'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow.cli.main", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("kind", ["envs", "tasks"])
def test_list_fits_80_columns_without_truncation(kind):
    table = cli(kind, "list")
    assert "…" not in table
    assert max(len(line) for line in table.splitlines()) <= 80
    # every id is there whole once the wrapped cell pieces of the first column are joined
    first_cells = "".join(
        line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")
    )
    key = "id" if kind == "envs" else "name"
    for row in json.loads(cli(kind, "list", "--json")):
        assert row[key] in first_cells, row[key]
