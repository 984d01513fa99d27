"""`astraflow status URL`."""

from __future__ import annotations

import typer

from cli.common import unavailable


def status(
    url: str = typer.Argument(..., help="Dataflow service URL, e.g. http://127.0.0.1:8700"),
    token: str = typer.Option(..., "--token", envvar="ASTRAFLOW_TOKEN", help="Run token"),
) -> None:
    """Render the dataflow service's status live."""
    unavailable("`astraflow status`")
