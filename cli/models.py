"""`astraflow models build|list`."""

from __future__ import annotations

import typer

from cli.common import unavailable

app = typer.Typer(help="Built-in models.", no_args_is_help=True)


@app.command()
def build(name: str = typer.Argument("tiny-arith")) -> None:
    """Build a built-in model checkpoint deterministically."""
    unavailable("`models build`")
