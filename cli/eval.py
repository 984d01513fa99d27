"""`astraflow eval agentbench`."""

from __future__ import annotations

import typer

from cli.common import unavailable

app = typer.Typer(help="Evaluate policies on benchmarks.", no_args_is_help=True)


@app.command()
def agentbench() -> None:
    """AgentBench (dbbench, os_interaction) against a policy."""
    unavailable("`eval agentbench`")
