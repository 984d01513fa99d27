"""The live rich view of a run, drawn from the dataflow service's ``/status`` document."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table


def _fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def render_status(st: dict | None, services: list, run_dir: str, started: float) -> Panel:
    elapsed = time.time() - started
    if not st:
        return Panel("waiting for the dataflow service…", title=f"astraflow · {run_dir}")
    pol = Table(title="policies", expand=True)
    for col in (
        "policy",
        "step",
        "version",
        "reward",
        "eval acc",
        "samples/s",
        "staleness",
        "buffer",
        "dropped",
    ):
        pol.add_column(col, justify="right" if col != "policy" else "left")
    policies = st.get("policies", {}) or {}
    for name, p in sorted(policies.items()):
        ev = p.get("last_eval") or {}
        pol.add_row(
            name,
            _fmt(p.get("step")),
            _fmt(p.get("version")),
            _fmt(p.get("reward_mean")),
            _fmt(ev.get("accuracy")),
            _fmt(p.get("samples_per_s"), 1),
            _fmt(p.get("staleness_mean"), 2),
            _fmt(p.get("buffer_groups")),
            _fmt(
                sum((p.get("dropped") or {}).values())
                if isinstance(p.get("dropped"), dict)
                else p.get("dropped")
            ),
        )
    nodes = Table(title="rollout nodes", expand=True)
    for col in ("node", "alive", "versions", "episodes/s", "tokens/s", "in flight"):
        nodes.add_column(col)
    for n in st.get("nodes", []) or []:
        m = n.get("metrics", {}) or {}
        nodes.add_row(
            str(n.get("name") or n.get("id")),
            "yes" if n.get("alive", True) else "no",
            " ".join(f"{k}:v{v}" for k, v in (n.get("versions") or {}).items()),
            _fmt(m.get("episodes_per_s"), 2),
            _fmt(m.get("tokens_per_s"), 0),
            _fmt(n.get("in_flight")),
        )
    q = st.get("queue", {}) or {}
    procs = "  ".join(
        f"{s.name}:{'up' if s.alive() else f'exit {s.returncode()}'}" for s in services
    )
    head = (
        f"elapsed {elapsed:6.0f}s · tasks pending {_fmt(q.get('pending'))} · leased {_fmt(q.get('leased'))}"
        f" · done {_fmt(q.get('completed'))}\n{procs}"
    )
    return Panel(Group(head, pol, nodes), title=f"astraflow · {run_dir}")
