"""`astraflow status URL`: a live rich view of a run's dataflow service (GET /status)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from cli.common import console, fail


def _fmt_age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.1f}m"


def render(doc: dict[str, Any]) -> Group:
    """Tables for one status document (pure: also used by tests and `--once`)."""
    done = "[green]done[/]" if doc.get("done") else "[yellow]running[/]"
    round_ = f"  round {doc['round']}" if doc.get("round") is not None else ""
    header = Text.from_markup(
        f"[bold]{doc.get('run', '?')}[/]  mode {doc.get('mode')}{round_}  {done}  "
        f"episodes {doc.get('episodes', 0)} ({doc.get('episodes_per_s', 0):.2f}/s)  "
        f"tasks done {doc.get('tasks_done', 0)}  in-flight leases {doc.get('in_flight_leases', 0)}"
        f"  expired {doc.get('expired_leases', 0)}"
    )
    queue = doc.get("queue") or {}
    header.append(
        "\nqueue: " + (", ".join(f"{k} {v}" for k, v in sorted(queue.items())) or "empty")
    )

    policies = Table(title="policies", expand=True)
    for col in (
        "policy",
        "trainable",
        "version",
        "steps",
        "buffer groups",
        "buffer samples",
        "unacked",
        "staleness (acked)",
        "dropped",
    ):
        policies.add_column(col)
    for name, p in (doc.get("policies") or {}).items():
        hist = " ".join(f"{k}:{v}" for k, v in (p.get("staleness") or {}).items()) or "-"
        dropped = " ".join(f"{k}:{v}" for k, v in (p.get("dropped") or {}).items()) or "-"
        policies.add_row(
            name,
            "yes" if p.get("trainable") else "frozen",
            str(p.get("latest_version") if p.get("latest_version") is not None else "-"),
            f"{p.get('steps', 0)}/{p.get('max_steps', '?')}",
            str(p.get("buffer_groups", 0)),
            str(p.get("buffer_samples", 0)),
            str(p.get("unacked_batches", 0)),
            hist,
            dropped,
        )

    nodes = Table(title="rollout nodes", expand=True)
    for col in (
        "node",
        "name",
        "region",
        "state",
        "heartbeat",
        "versions",
        "leases",
        "episodes",
        "ep/s",
    ):
        nodes.add_column(col)
    for n in doc.get("nodes") or []:
        state = n.get("state", "?")
        color = {"active": "green", "silent": "red", "left": "dim"}.get(state, "white")
        nodes.add_row(
            n.get("id", "?"),
            n.get("name", ""),
            n.get("region", ""),
            f"[{color}]{state}[/]",
            _fmt_age(n.get("seconds_since_heartbeat", 0.0)) + " ago",
            " ".join(f"{k}:{v}" for k, v in (n.get("versions") or {}).items()),
            str(n.get("active_leases", 0)),
            str(n.get("episodes", 0)),
            f"{n.get('episodes_per_s', 0.0):.2f}",
        )

    evals = Table(title="evaluations", expand=True)
    for col in ("policy", "version", "step", "task set", "progress", "accuracy", "errors"):
        evals.add_column(col)
    for e in doc.get("evaluations") or []:
        acc = e.get("accuracy")
        evals.add_row(
            e.get("policy", "?"),
            str(e.get("version")),
            str(e.get("step")),
            f"{e.get('task_set')}/{e.get('split')}",
            f"{e.get('completed', 0)}/{e.get('num_tasks', 0)}" + (" done" if e.get("done") else ""),
            "-" if acc is None else f"{acc:.3f}",
            str(e.get("errors", 0)),
        )
    parts: list[Any] = [header, policies, nodes]
    if doc.get("evaluations"):
        parts.append(evals)
    return Group(*parts)


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
                    if doc.get("done"):
                        break
        except KeyboardInterrupt:
            pass
