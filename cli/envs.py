"""`astraflow envs list|show|check`."""

from __future__ import annotations

import typer

from cli.common import unavailable

app = typer.Typer(help="Environments: built-in and plugins.", no_args_is_help=True)


@app.command("list")
def list_() -> None:
    """Table of every registered environment."""
    unavailable("`envs list`")
