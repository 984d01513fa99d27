"""`astraflow status URL`: a live rich view of a run's dataflow service (GET /status).

Read through the typed client and drawn by the launcher's renderer (``astraflow.launch.live``), so
both views show the same thing."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from astraflow.cli.common import CA_FILE_OPTION, console, dataflow_client, fail
from rich.text import Text


def status(
    url: str = typer.Argument(..., help="Dataflow service URL, e.g. http://127.0.0.1:8700"),
    token: str = typer.Option(
        ..., "--token", envvar="ASTRAFLOW_TOKEN", help="Run secret, admin or trainer token"
    ),
    ca_file: Path = CA_FILE_OPTION,
    once: bool = typer.Option(False, "--once", help="Print the status once and exit"),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="Refresh period (seconds)"),
    run_dir: Path = typer.Option(
        None,
        "--run-dir",
        help="The run's directory: adds the autoscaler's pool and decisions (autoscale.jsonl)",
    ),
) -> None:
    """Render the dataflow service's status live."""
    from rich.console import Group
    from rich.live import Live

    from astraflow.launch.live import render as render_status
    from astraflow.launch.scaling import describe_log
    from astraflow.launch.text import safe_text
    from astraflow.protocol.client import DataflowClientError

    def render(doc):
        line = describe_log(run_dir / "autoscale.jsonl") if run_dir is not None else None
        view = render_status(doc)
        if line is None:
            return view
        line = safe_text(line, None, markup=False)
        return Group(Text(line, style="cyan", overflow="fold"), view)

    with dataflow_client(url, token, ca_file) as client:
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
                        why = safe_text(f"status unavailable: {exc}", 500, markup=False)
                        live.update(Text(why, style="red"))
                        continue
                    live.update(render(doc))
                    if doc.done:
                        break
        except KeyboardInterrupt:
            pass
