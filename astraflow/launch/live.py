"""The one status renderer: ``GET /status`` of the dataflow service, plus the run's metrics.

``astraflow status URL`` and the launcher's live view both draw with :func:`render`. Status gives
queues, nodes, versions, buffers, drops and evaluations; when the run directory is at hand, the
newest ``step`` record per policy in ``metrics.jsonl`` adds reward, throughput and staleness, so
the view needs no extra endpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from astraflow.launch.tracking import JsonlFollower
from astraflow.protocol.messages import EvaluationResult
from astraflow.protocol.status import DataflowStatus


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


def latest_evals(st: DataflowStatus) -> dict[str, EvaluationResult]:
    """The newest finished evaluation with an accuracy, per policy."""
    out: dict[str, EvaluationResult] = {}
    for ev in st.evaluations:
        if ev.done and ev.accuracy is not None:
            prev = out.get(ev.policy)
            if prev is None or ev.version >= prev.version:
                out[ev.policy] = ev
    return out


def _counts(d: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in d.items()) or "-"


def _age(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else f"{seconds / 60:.1f}m"


def render(st: DataflowStatus, tail: MetricsTail | None = None) -> Group:
    """The tables of one status document: the one renderer behind ``astraflow status`` and the
    launcher's live view. With the run's metrics (the launcher has the run directory), the policy
    table also shows the newest step's reward and staleness and the sample rate."""
    last = tail.poll() if tail else {}
    done = "[green]done[/]" if st.done else "[yellow]running[/]"
    round_ = f"  round {st.round}" if st.round is not None else ""
    header = Text.from_markup(
        f"[bold]{st.run}[/]  mode {st.mode}{round_}  {done}  "
        f"episodes {st.episodes} ({st.episodes_per_s:.2f}/s)  "
        f"tasks done {st.tasks_done}  in-flight leases {st.in_flight_leases}"
        f"  expired {st.expired_leases}"
    )
    header.append(
        "\nqueue: " + (", ".join(f"{k} {v}" for k, v in sorted(st.queue.items())) or "empty")
    )

    evals = latest_evals(st)
    pol = Table(title="policies", expand=True)
    cols = ["policy", "step", "version", "eval acc"]
    if tail:
        cols += ["reward", "samples/s", "staleness (mean)"]
    cols += ["buffer groups", "buffer samples", "unacked", "staleness (acked)", "dropped"]
    for col in cols:
        pol.add_column(col, justify="left" if col == "policy" else "right")
    for name, p in sorted(st.policies.items()):
        ev = evals.get(name)
        row = [
            name + ("" if p.trainable else " (frozen)"),
            f"{p.steps}/{p.max_steps}",
            _fmt(p.latest_version),
            f"{ev.accuracy:.3f} @v{ev.version}" if ev else "-",
        ]
        if tail:
            rec = last.get(name, {})
            row += [
                _fmt(rec.get("reward_mean")),
                _fmt(tail.samples_per_s(name), 1),
                _fmt(rec.get("staleness_mean"), 2),
            ]
        row += [
            str(p.buffer_groups),
            str(p.buffer_samples),
            str(p.unacked_batches),
            _counts(p.staleness),
            _counts(p.dropped),
        ]
        pol.add_row(*row)

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
        "episodes/s",
        "tokens/s",
    ):
        nodes.add_column(col)
    for n in st.nodes:
        color = {"active": "green", "silent": "red", "left": "dim"}.get(n.state, "white")
        nodes.add_row(
            n.id,
            n.name,
            n.region,
            f"[{color}]{n.state}[/]",
            _age(n.seconds_since_heartbeat) + " ago",
            " ".join(f"{k}:v{v}" for k, v in n.versions.items()),
            str(n.active_leases),
            str(n.episodes),
            f"{n.episodes_per_s:.2f}",
            _fmt(n.metrics.get("tokens_per_s"), 0),
        )

    parts: list[RenderableType] = [header, pol, nodes]
    if st.evaluations:
        table = Table(title="evaluations", expand=True)
        for col in ("policy", "version", "step", "task set", "progress", "accuracy", "errors"):
            table.add_column(col)
        for e in st.evaluations:
            table.add_row(
                e.policy,
                str(e.version),
                str(e.step),
                f"{e.task_set}/{e.split}",
                f"{e.completed}/{e.num_tasks}" + (" done" if e.done else ""),
                _fmt(e.accuracy),
                str(e.errors),
            )
        parts.append(table)
    return Group(*parts)


def render_status(
    st: DataflowStatus | None,
    services: list,
    run_dir: str,
    started: float,
    tail: MetricsTail | None = None,
) -> Panel:
    """The launcher's live view: :func:`render` under a line with the elapsed time and the state
    of each process the launcher started."""
    if st is None:
        return Panel("waiting for the dataflow service…", title=f"astraflow · {run_dir}")
    procs = "  ".join(
        f"{s.name}:{'up' if s.alive() else f'exit {s.returncode()}'}" for s in services
    )
    head = f"elapsed {time.time() - started:5.0f}s · {procs}"
    return Panel(Group(head, render(st, tail)), title=f"astraflow · {run_dir}")


def status_line(st: DataflowStatus | None, elapsed: float, tail: MetricsTail | None = None) -> str:
    """One plain line per update, for logs and non-terminal output."""
    if st is None:
        return f"[{elapsed:6.0f}s] waiting for the dataflow service"
    last = tail.poll() if tail else {}
    evals = latest_evals(st)
    parts = []
    for name, p in sorted(st.policies.items()):
        reward = last.get(name, {}).get("reward_mean")
        ev = evals.get(name)
        parts.append(
            f"{name}: step {p.steps}/{p.max_steps} v{_fmt(p.latest_version)}"
            + (f" reward {reward:.3f}" if isinstance(reward, (int, float)) else "")
            + (f" eval {ev.accuracy:.3f}@v{ev.version}" if ev else "")
        )
    return f"[{elapsed:6.0f}s] " + " | ".join(parts)
