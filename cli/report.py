"""`astraflow report RUN_DIR`."""

from __future__ import annotations

from pathlib import Path

import typer
from astraflow.cli.common import console, fail

from astraflow.launch.text import safe_text


def report(run_dir: Path = typer.Argument(..., help="Run directory")) -> None:
    """Write PNG plots (reward, eval accuracy, throughput, staleness) and a markdown summary."""
    from astraflow.launch.report import write_report

    try:
        out = write_report(run_dir)
    except FileNotFoundError as exc:
        fail(str(exc))
    console.print(f"wrote {out / 'overview.png'} and {out / 'summary.md'}")
    summary = (out / "summary.md").read_text()
    console.print(safe_text(summary, None, markup=False, multiline=True), markup=False)
