"""`astraflow report RUN_DIR`."""

from __future__ import annotations

from pathlib import Path

import typer

from cli.common import unavailable


def report(run_dir: Path = typer.Argument(..., help="Run directory")) -> None:
    """Write PNG plots and a markdown summary of a run."""
    unavailable("`astraflow report`")
