"""`astraflow status URL`: a live rich view of a run's dataflow service (GET /status).

Read through the typed client and drawn by the launcher's renderer (``astraflow.launch.live``), so
both views show the same thing."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.text import Text

from cli.common import console, fail


def status(
    url: str = typer.Argument(..., help="Dataflow service URL, e.g. http://127.0.0.1:8700"),
    token: str = typer.Option(
        ..., "--token", envvar="ASTRAFLOW_TOKEN", help="Run secret, admin or trainer token"
    ),
    ca_file: Path = typer.Option(
        None, "--ca-file", envvar="ASTRAFLOW_CA_FILE", help="CA to verify an https:// URL against"
    ),
    once: bool = typer.Option(False, "--once", help="Print the status once and exit"),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="Refresh period (seconds)"),
) -> None:
    """Render the dataflow service's status live."""
    from rich.live import Live

    from astraflow.launch.live import render
    from astraflow.protocol.client import DataflowClientError, SyncDataflowClient
    from astraflow.protocol.tls import TLSConfigError

    try:
        client = SyncDataflowClient(
            url, token, timeout=10.0, retries=1, ca_file=str(ca_file) if ca_file else None
        )
    except TLSConfigError as exc:
        fail(str(exc))
    with client:
        try:
            doc = client.status()
        except DataflowClientError as exc:
            fail(str(exc))
        if once:
            console.print(render(doc))
            return
        try:
            with Live(render(doc), console=console, refresh_per_second=4) as live:
                while True:
                    time.sleep(interval)
                    try:
                        doc = client.status()
                    except DataflowClientError as exc:
                        live.update(Text(f"status unavailable: {exc}", style="red"))
                        continue
                    live.update(render(doc))
                    if doc.done:
                        break
        except KeyboardInterrupt:
            pass
