"""`astraflow stop URL`: end a running job cleanly (``POST /run/stop``, admin token).

Trainers checkpoint and exit, nodes finish or hand back their episodes and exit, and the launcher
of the run (``astraflow train``) ends as it does at the end of a run."""

from __future__ import annotations

from pathlib import Path

import typer
from astraflow.cli.common import CA_FILE_OPTION, console, dataflow_client, fail

from astraflow.launch.text import safe_text


def stop(
    url: str = typer.Argument(..., help="Dataflow service URL, e.g. http://127.0.0.1:8700"),
    token: str = typer.Option(
        ..., "--token", envvar="ASTRAFLOW_TOKEN", help="Run secret or admin token"
    ),
    reason: str = typer.Option("stopped by an admin", "--reason", help="Recorded in the status"),
    ca_file: Path = CA_FILE_OPTION,
) -> None:
    """Stop a run: every service checkpoints or drains and exits 0."""
    from astraflow.protocol.client import DataflowClientError

    with dataflow_client(url, token, ca_file, retries=2) as client:
        try:
            ack = client.stop_run(reason)
        except DataflowClientError as exc:
            fail(str(exc))
    # the service's words (they may quote the --reason or a node's): text, not markup
    console.print(safe_text(ack.detail or "run stopped", 2000, multiline=True), highlight=False)
