"""`astraflow serve dataflow|rollout|trainer`."""

from __future__ import annotations

import typer

from cli.common import unavailable

app = typer.Typer(help="Run one AstraFlow service.", no_args_is_help=True)


@app.command()
def dataflow() -> None:
    """Dataflow service: tasks, leases, buffers, dataflow policies."""
    unavailable("`serve dataflow`")


@app.command()
def rollout() -> None:
    """Rollout node: engines, workflows, envs; joins a running job."""
    unavailable("`serve rollout`")


@app.command()
def trainer() -> None:
    """Trainer for one policy (TRL GRPO family)."""
    unavailable("`serve trainer`")
