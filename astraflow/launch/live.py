"""The one status renderer: ``GET /status`` of the dataflow service, plus the run's metrics.

``astraflow status URL`` and the launcher's live view both draw with :func:`render`. Status gives
queues, nodes, versions, buffers, drops and evaluations; when the run directory is at hand, the
newest ``step`` record per policy in ``metrics.jsonl`` adds reward, throughput and staleness, so
the view needs no extra endpoint.

Every text the status document carries (node ids, names, regions, episode errors, policy and task
set names) passes through :func:`astraflow.launch.text.safe_text` before it reaches Rich: rollout
nodes are not trusted, and Rich reads a ``str`` as markup and passes escape sequences through.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from astraflow.launch.text import safe_text
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
    """``k:v`` pairs, plain (not escaped: callers escape or put it in a ``Text``)."""
    return " ".join(f"{safe_text(k, 60, markup=False)}:{v}" for k, v in d.items()) or "-"


def _age(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else f"{seconds / 60:.1f}m"


def drop_text(st: DataflowStatus) -> str:
    """Samples dropped, by policy and reason, in full (no column to truncate them). Plain text,
    cleaned of control characters, not markup-escaped."""
    parts = []
    for name, p in sorted(st.policies.items()):
        if p.dropped:
            counts = ", ".join(
                f"{safe_text(k, 80, markup=False)} {v:,}" for k, v in sorted(p.dropped.items())
            )
            parts.append(f"{safe_text(name, 80, markup=False)}: {counts}")
    return "; ".join(parts)


def error_texts(st: DataflowStatus, width: int = 160) -> list[str]:
    """Failed episodes by reason with the first message of each:
    ``episode_error: 849 — BadRequest: prompt has 443 tokens; the model's context is 256``.
    Plain text (the message is a node's: cleaned of control characters, not markup-escaped)."""
    out = []
    for reason, e in sorted(st.errors.items()):
        first = safe_text(" ".join(safe_text(e.first, None, markup=False).split()), width,
                          markup=False)  # fmt: skip
        reason = safe_text(reason, 80, markup=False)
        out.append(f"{reason}: {e.count:,}" + (f" — {first}" if first else ""))
    return out


def problem_lines(st: DataflowStatus) -> list[str]:
    """What the views show under the policy table: drops in full, then errors (plain text, for
    a ``Text``)."""
    lines = []
    drops = drop_text(st)
    if drops:
        lines.append(f"dropped samples: {drops}")
    lines += [f"failed episodes: {e}" for e in error_texts(st)]
    return lines


def nodes_not_listed(st: DataflowStatus) -> str | None:
    """A line for the registered nodes the status document does not list (a large pool: it
    lists a bounded number of them and counts all in ``node_summary``), or None. Plain text
    (region names are the nodes': cleaned, not markup-escaped), for a ``Text``."""
    s = st.node_summary
    shown = sum(1 for n in st.nodes if n.state != "left")
    registered = s.active + s.silent
    if registered <= shown:
        return None
    regions = ", ".join(
        f"{safe_text(name, 60, markup=False) or '-'} {r.active}"
        + (f" (+{r.silent} silent)" if r.silent else "")
        for name, r in s.regions.items()
    )
    return (
        f"{shown} of {registered} registered nodes shown: {s.active} active, {s.silent} silent, "
        f"{s.left} left, {s.active_leases} leases, {s.episodes_per_s:.2f} episodes/s; "
        f"active by region: {regions}"
    )


def render(st: DataflowStatus, tail: MetricsTail | None = None) -> Group:
    """The tables of one status document: the one renderer behind ``astraflow status`` and the
    launcher's live view. With the run's metrics (the launcher has the run directory), the policy
    table also shows the newest step's reward and staleness and the sample rate."""
    last = tail.poll() if tail else {}
    done = "[green]done[/]" if st.done else "[yellow]running[/]"
    round_ = f"  round {st.round}" if st.round is not None else ""
    header = Text.from_markup(
        f"[bold]{safe_text(st.run)}[/]  mode {safe_text(st.mode, 40)}{round_}  {done}  "
        f"episodes {st.episodes} ({st.episodes_per_s:.2f}/s)  "
        f"tasks done {st.tasks_done}  in-flight leases {st.in_flight_leases}"
        f"  expired {st.expired_leases}"
        + (f"  saved episodes {st.saved_episodes}" if st.saved_episodes else "")
    )
    header.append(
        "\nqueue: "
        + (
            ", ".join(f"{safe_text(k, 80, markup=False)} {v}" for k, v in sorted(st.queue.items()))
            or "empty"
        )
    )

    evals = latest_evals(st)
    pol = Table(title="policies", expand=True)
    cols = ["policy", "step", "version", "eval acc"]
    if tail:
        cols += ["reward", "samples/s", "staleness (mean)"]
    cols += ["buffer groups", "buffer samples", "unacked", "trainer idle", "staleness (acked)"]
    for col in cols:
        pol.add_column(col, justify="left" if col == "policy" else "right", overflow="fold")
    for name, p in sorted(st.policies.items()):
        ev = evals.get(name)
        row = [
            safe_text(name, 80) + ("" if p.trainable else " (frozen)"),
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
            _fmt(p.trainer_idle, 2),
            safe_text(_counts(p.staleness), None),
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
        nodes.add_column(col, overflow="fold")
    for n in st.nodes:
        color = {"active": "green", "silent": "red", "left": "dim"}.get(n.state, "white")
        # every cell is the node's own text: escaped and cleaned (a node named "[/]" is a name)
        nodes.add_row(
            safe_text(n.id, 80),
            safe_text(n.name, 80),
            safe_text(n.region, 60),
            f"[{color}]{safe_text(n.state, 20)}[/]",
            _age(n.seconds_since_heartbeat) + " ago",
            " ".join(f"{safe_text(k, 60)}:v{v}" for k, v in n.versions.items()),
            str(n.active_leases),
            str(n.episodes),
            f"{n.episodes_per_s:.2f}",
            safe_text(_fmt(n.metrics.get("tokens_per_s"), 0), 20),
        )

    parts: list[RenderableType] = [header, pol]
    problems = problem_lines(st)
    if problems:
        parts.append(Text("\n".join(problems), style="yellow", overflow="fold"))
    parts.append(nodes)
    unlisted = nodes_not_listed(st)
    if unlisted:
        parts.append(Text(unlisted, style="dim", overflow="fold"))
    if st.evaluations:
        table = Table(title="evaluations", expand=True)
        for col in ("policy", "version", "step", "task set", "progress", "accuracy", "errors"):
            table.add_column(col, overflow="fold")
        for e in st.evaluations:
            table.add_row(
                safe_text(e.policy, 80),
                str(e.version),
                str(e.step),
                safe_text(f"{e.task_set}/{e.split}", 120),
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
    autoscale: str | None = None,
) -> Panel:
    """The launcher's live view: :func:`render` under a line with the elapsed time and the state
    of each process the launcher started, and the autoscaler's line (pool, figures, decisions)
    when it runs."""
    title = f"astraflow · {safe_text(run_dir, None)}"
    if st is None:
        return Panel("waiting for the dataflow service…", title=title)
    procs = "  ".join(
        f"{s.name}:{'up' if s.alive() else f'exit {s.returncode()}'}" for s in services
    )
    head: list[RenderableType] = [
        Text(safe_text(f"elapsed {time.time() - started:5.0f}s · {procs}", None, markup=False))
    ]
    if autoscale:
        head.append(Text(safe_text(autoscale, None, markup=False), style="cyan", overflow="fold"))
    return Panel(Group(*head, render(st, tail)), title=title)


def status_line(
    st: DataflowStatus | None,
    elapsed: float,
    tail: MetricsTail | None = None,
    autoscale: str | None = None,
) -> str:
    """One line per update, for logs and non-terminal output (with the autoscaler's line when it
    runs): cleaned of control characters and markup-escaped, for ``console.print``."""
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
    line = f"[{elapsed:6.0f}s] " + " | ".join(parts)
    drops = drop_text(st)
    if drops:
        line += f" | dropped {drops}"
    errors = error_texts(st, width=120)
    if errors:
        line += " | failed " + "; ".join(errors)
    if autoscale:
        line += " | " + autoscale
    # the whole line is plain text: one pass cleans and escapes what the nodes put in it
    return safe_text(line, None)
