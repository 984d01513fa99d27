"""The live rich view of a run: ``GET /status`` of the dataflow service plus the run's metrics.

Status gives queues, nodes, versions, buffers and drops; the newest ``step`` record per policy in
``metrics.jsonl`` gives reward, throughput and staleness, so the view needs no extra endpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from astraflow.launch.tracking import JsonlFollower


def _fmt(v: Any, nd: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


class MetricsTail:
    """Follows ``metrics.jsonl`` incrementally: newest step record per policy, step rates."""

    def __init__(self, path: Path):
        self.path = path
        self.follower = JsonlFollower(path)
        self.last_step: dict[str, dict] = {}
        self.first_time: dict[str, float] = {}
        self.samples: dict[str, int] = {}

    def poll(self) -> dict[str, dict]:
        rewritten, records = self.follower.poll()
        if rewritten:  # a rewound timeline: the file was rewritten, read it afresh
            self.last_step, self.first_time, self.samples = {}, {}, {}
        for rec in records:
            if rec.get("type") != "step":
                continue
            policy = rec.get("policy", "policy")
            self.first_time.setdefault(policy, rec.get("time", time.time()))
            self.samples[policy] = self.samples.get(policy, 0) + int(rec.get("samples", 0))
            self.last_step[policy] = rec
        return self.last_step

    def samples_per_s(self, policy: str) -> float | None:
        rec = self.last_step.get(policy)
        if not rec or policy not in self.first_time:
            return None
        span = rec.get("time", 0) - self.first_time[policy]
        return self.samples[policy] / span if span > 0 else None


def latest_evals(st: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for ev in st.get("evaluations", []) or []:
        if ev.get("done") and ev.get("accuracy") is not None:
            prev = out.get(ev["policy"])
            if prev is None or ev.get("version", 0) >= prev.get("version", 0):
                out[ev["policy"]] = ev
    return out


def render_status(
    st: dict | None, services: list, run_dir: str, started: float, tail: MetricsTail | None = None
) -> Panel:
    elapsed = time.time() - started
    if not st:
        return Panel("waiting for the dataflow service…", title=f"astraflow · {run_dir}")
    last = tail.poll() if tail else {}
    evals = latest_evals(st)
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
        pol.add_column(col, justify="left" if col == "policy" else "right")
    for name, p in sorted((st.get("policies") or {}).items()):
        rec = last.get(name, {})
        ev = evals.get(name, {})
        dropped = sum((p.get("dropped") or {}).values())
        pol.add_row(
            name + ("" if p.get("trainable", True) else " (frozen)"),
            f"{p.get('steps', 0)}/{p.get('max_steps', '?')}",
            _fmt(p.get("latest_version")),
            _fmt(rec.get("reward_mean")),
            (f"{ev['accuracy']:.3f} @v{ev.get('version')}" if ev else "-"),
            _fmt(tail.samples_per_s(name) if tail else None, 1),
            _fmt(rec.get("staleness_mean"), 2),
            _fmt(p.get("buffer_groups")),
            _fmt(dropped),
        )
    nodes = Table(title="rollout nodes", expand=True)
    for col in ("node", "state", "versions", "episodes/s", "tokens/s", "leases"):
        nodes.add_column(col)
    for n in st.get("nodes", []) or []:
        m = n.get("metrics", {}) or {}
        nodes.add_row(
            str(n.get("name") or n.get("id")), str(n.get("state", "")),
            " ".join(f"{k}:v{v}" for k, v in (n.get("versions") or {}).items()),
            _fmt(n.get("episodes_per_s"), 1), _fmt(m.get("tokens_per_s"), 0), _fmt(n.get("active_leases")),
        )  # fmt: skip
    queue = sum((st.get("queue") or {}).values())
    procs = "  ".join(
        f"{s.name}:{'up' if s.alive() else f'exit {s.returncode()}'}" for s in services
    )
    head = (
        f"elapsed {elapsed:5.0f}s · mode {st.get('mode')} · tasks queued {queue} · leased "
        f"{st.get('in_flight_leases', 0)} · done {st.get('tasks_done', 0)} · episodes/s "
        f"{st.get('episodes_per_s', 0):.1f}\n{procs}"
    )
    return Panel(Group(head, pol, nodes), title=f"astraflow · {run_dir}")


def status_line(st: dict | None, elapsed: float, tail: MetricsTail | None = None) -> str:
    """One plain line per update, for logs and non-terminal output."""
    if not st:
        return f"[{elapsed:6.0f}s] waiting for the dataflow service"
    last = tail.poll() if tail else {}
    evals = latest_evals(st)
    parts = []
    for name, p in sorted((st.get("policies") or {}).items()):
        rec = last.get(name, {})
        reward = rec.get("reward_mean")
        ev = evals.get(name)
        parts.append(
            f"{name}: step {p.get('steps', 0)}/{p.get('max_steps')} v{p.get('latest_version')}"
            + (f" reward {reward:.3f}" if isinstance(reward, (int, float)) else "")
            + (f" eval {ev['accuracy']:.3f}@v{ev['version']}" if ev else "")
        )
    return f"[{elapsed:6.0f}s] " + " | ".join(parts)
