"""`astraflow dashboard RUN_DIR|URL`: the run in a browser (figures, nodes, single trajectories).

A run directory is read from its files (``metrics.jsonl``, the store's kept transcripts) and, while
the run is live, from its service too; a URL is read from the live service alone. The page is
read-only and needs the run's admin token, which the printed address carries.
"""

from __future__ import annotations

from pathlib import Path

import typer
from astraflow.cli.common import CA_FILE_OPTION, console, dataflow_client, fail


def dashboard(
    source: str = typer.Argument(..., help="Run directory, or a dataflow URL (with --token)"),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address"),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port; 0 picks a free one"),
    token: str = typer.Option(
        None,
        "--token",
        envvar="ASTRAFLOW_TOKEN",
        help="Run secret (admin token); default: RUN_DIR/run.secret",
    ),
    ca_file: Path = CA_FILE_OPTION,
) -> None:
    """Serve the web dashboard of a run (read-only, token-protected) and print its address."""
    from astraflow.launch.dashboard import DashboardSource, create_dashboard_app
    from astraflow.protocol.client import DataflowClientError
    from astraflow.protocol.http_server import run

    client = None
    run_dir: Path | None = None
    if source.startswith(("http://", "https://")):
        if not token:
            fail("a URL needs --token (the run secret, in RUN_DIR/run.secret)")
        client = dataflow_client(source, token, ca_file)
        try:
            client.healthz()
        except DataflowClientError as exc:
            fail(str(exc))
    else:
        run_dir = Path(source)
        if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "dataflow.db").exists():
            fail(f"{run_dir} is not a run directory (no metrics.jsonl or dataflow.db)")
        secret = run_dir / "run.secret"
        if not token:
            if not secret.exists():
                fail(f"no --token and no {secret}")
            token = secret.read_text().strip()
        url_file = run_dir / "dataflow.url"
        if url_file.exists():  # a live run: its service adds status, nodes and errors
            client = dataflow_client(url_file.read_text().strip(), token, None, timeout=5.0,
                                     retries=0)  # fmt: skip
    try:
        app = create_dashboard_app(DashboardSource(run_dir, client), token)
    except (DataflowClientError, ValueError) as exc:
        fail(str(exc))

    def listening(url: str) -> None:
        console.print(f"dashboard at {url}/?token={token}", highlight=False, soft_wrap=True)

    try:
        run(app, host, port, on_listening=listening)
    finally:
        if client is not None:
            client.close()
