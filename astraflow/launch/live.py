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
from collections import deque
from pathlib import Path
from typing import Any

from rich import box
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


#: steps the ETA's pace is measured over (recent steps: the first ones wait for rollouts to fill)
ETA_WINDOW = 10


class MetricsTail:
    """Follows ``metrics.jsonl`` incrementally: newest step record per policy, step rates."""

    def __init__(self, path: Path):
        self.path = path
        self.follower = JsonlFollower(path)
        self.last_step: dict[str, dict] = {}
        self.first_time: dict[str, float] = {}
        self.samples: dict[str, int] = {}
        self.step_times: dict[str, deque[float]] = {}

    def poll(self) -> dict[str, dict]:
        rewritten, records = self.follower.poll()
        if rewritten:  # a rewound timeline: the file was rewritten, read it afresh
            self.last_step, self.first_time, self.samples, self.step_times = {}, {}, {}, {}
        for rec in records:
            if rec.get("type") != "step":
                continue
            policy = rec.get("policy", "policy")
            self.first_time.setdefault(policy, rec.get("time", time.time()))
            self.samples[policy] = self.samples.get(policy, 0) + int(rec.get("samples", 0))
            self.last_step[policy] = rec
            if isinstance(rec.get("time"), (int, float)):
                window = self.step_times.setdefault(policy, deque(maxlen=ETA_WINDOW + 1))
                window.append(float(rec["time"]))
        return self.last_step

    def seconds_per_step(self, policy: str) -> float | None:
        """The recent pace of ``policy``'s steps (over the last :data:`ETA_WINDOW` steps)."""
        times = self.step_times.get(policy)
        if not times or len(times) < 2 or times[-1] <= times[0]:
            return None
        return (times[-1] - times[0]) / (len(times) - 1)

    def eta_s(self, policy: str, steps: int, max_steps: int) -> float | None:
        """Seconds until ``policy`` reaches ``max_steps`` at its recent pace (None: unknown)."""
        pace = self.seconds_per_step(policy)
        if pace is None:
            return None
        return max(0, max_steps - steps) * pace

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


def duration(seconds: float | None) -> str:
    """``45s``, ``12m05s``, ``3h07m``: an ETA or elapsed time a person reads at a glance."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def short_id(node_id: str) -> str:
    """``node-5f29e11b`` for ``node-5f29e11b22a14177``: enough to tell nodes apart in a table
    that fits 100 columns (``GET /status`` has the full id)."""
    return node_id[:13]


def run_eta(st: DataflowStatus, tail: MetricsTail | None) -> float | None:
    """Seconds until the slowest trainable policy reaches its max_steps (None: not known yet)."""
    if tail is None:
        return None
    etas = [
        tail.eta_s(name, p.steps, p.max_steps) for name, p in st.policies.items() if p.trainable
    ]
    return None if not etas or any(e is None for e in etas) else max(etas)


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
    # short headers, no vertical rules: the view fits 100 columns (it needed ~150)
    pol = Table(title="policies", expand=True, box=box.SIMPLE_HEAD, padding=(0, 1))
    cols = ["policy", "step", "ver", "eval acc"]
    if tail:
        cols += ["reward", "smp/s", "stale", "ETA"]
    cols += ["buffer", "unacked", "idle"]
    for col in cols:
        pol.add_column(col, justify="left" if col == "policy" else "right", overflow="fold")
    acked = []
    for name, p in sorted(st.policies.items()):
        ev = evals.get(name)
        row = [
            safe_text(name, 80) + ("" if p.trainable else " (frozen)"),
            f"{p.steps}/{p.max_steps}",
            _fmt(p.latest_version),
            f"{ev.accuracy:.3f}@v{ev.version}" if ev else "-",
        ]
        if tail:
            rec = last.get(name, {})
            row += [
                _fmt(rec.get("reward_mean")),
                _fmt(tail.samples_per_s(name), 1),
                _fmt(rec.get("staleness_mean"), 2),
                duration(tail.eta_s(name, p.steps, p.max_steps)) if p.trainable else "-",
            ]
        row += [
            f"{p.buffer_groups}g/{p.buffer_samples}s",
            str(p.unacked_batches),
            _fmt(p.trainer_idle, 2),
        ]
        pol.add_row(*row)
        if p.staleness:
            acked.append(f"{safe_text(name, 80, markup=False)} {_counts(p.staleness)}")

    nodes = Table(title="rollout nodes", expand=True, box=box.SIMPLE_HEAD, padding=(0, 1))
    for col in ("node", "name", "region", "state", "seen", "versions", "leases", "episodes",
                "ep/s", "tok/s"):  # fmt: skip
        nodes.add_column(col, overflow="fold", min_width=13 if col == "node" else None)
    for n in st.nodes:
        color = {"active": "green", "silent": "red", "left": "dim"}.get(n.state, "white")
        # every cell is the node's own text: escaped and cleaned (a node named "[/]" is a name)
        nodes.add_row(
            safe_text(short_id(safe_text(n.id, None, markup=False)), 80),
            safe_text(n.name, 80),
            safe_text(n.region, 60),
            f"[{color}]{safe_text(n.state, 20)}[/]",
            _age(n.seconds_since_heartbeat),
            " ".join(f"{safe_text(k, 60)}:v{v}" for k, v in n.versions.items()),
            str(n.active_leases),
            str(n.episodes),
            f"{n.episodes_per_s:.2f}",
            safe_text(_fmt(n.metrics.get("tokens_per_s"), 0), 20),
        )

    parts: list[RenderableType] = [header, pol]
    if acked:  # versions behind of the samples each policy trained on, as a histogram
        parts.append(Text("staleness of trained samples: " + "; ".join(acked), overflow="fold"))
    problems = problem_lines(st)
    if problems:
        parts.append(Text("\n".join(problems), style="yellow", overflow="fold"))
    parts.append(nodes)
    unlisted = nodes_not_listed(st)
    if unlisted:
        parts.append(Text(unlisted, style="dim", overflow="fold"))
    if st.evaluations:
        table = Table(title="evaluations", expand=True, box=box.SIMPLE_HEAD, padding=(0, 1))
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
    eta = run_eta(st, tail)
    timing = f"elapsed {duration(time.time() - started)}" + (
        f" · ETA {duration(eta)}" if eta is not None else ""
    )
    head: list[RenderableType] = [
        Text(safe_text(f"{timing} · {procs}", None, markup=False), overflow="fold")
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
        eta = tail.eta_s(name, p.steps, p.max_steps) if tail and p.trainable else None
        parts.append(
            f"{name}: step {p.steps}/{p.max_steps} v{_fmt(p.latest_version)}"
            + (f" reward {reward:.3f}" if isinstance(reward, (int, float)) else "")
            + (f" eval {ev.accuracy:.3f}@v{ev.version}" if ev else "")
            + (f" ETA {duration(eta)}" if eta is not None else "")
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
