"""The autoscaler's control loop: apply :mod:`astraflow.launch.autoscale`'s decisions to the
launcher's rollout pool and write each one to ``run_dir/autoscale.jsonl``.

It owns which of the launcher's nodes are in the pool, which are draining and which have left;
the launcher gives it a status document every ``autoscale.interval_s`` and the two actions it
needs: start node *i* (the launcher's own command line and placement, so a grown node is exactly
one the launcher would have started) and ask a node to drain (one SIGTERM: the node stops asking
for work, finishes its groups within its drain timeout, hands back the rest and deregisters; see
:meth:`astraflow.rollout.node.RolloutNode._drain`). A node that drained is never restarted and its
name never reused, so a restarted and a drained node cannot be confused in the store.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from astraflow.launch.autoscale import Autoscaler, figures, groups_per_node
from astraflow.protocol.status import DataflowStatus
from astraflow.recipe import Recipe


class NodeService(Protocol):
    name: str

    @property
    def pid(self) -> int | None: ...

    def returncode(self) -> int | None: ...

    def drain(self) -> None: ...


@dataclass
class AutoscaleLog:
    """``run_dir/autoscale.jsonl``: one line per decision (``decision``: grow, shrink, hold) and
    per node that finished draining (``event``: left), for people, the live view and the bench."""

    path: Path

    def write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"time": time.time(), **record}) + "\n")  # (a record's own wins)


@dataclass
class PoolScaler:
    """Grows and shrinks the launcher's nodes named ``node-<i>``; indices of grown nodes continue
    after the highest one the run has had."""

    recipe: Recipe
    log: AutoscaleLog
    start_node: Callable[[int], NodeService]
    autoscaler: Autoscaler = field(init=False)
    #: nodes asked to drain and not exited yet, by name
    draining: dict[str, NodeService] = field(default_factory=dict)
    #: every node that was asked to leave (drained or draining): not restarted, not in the pool
    retired: set[str] = field(default_factory=set)
    #: the newest decision's record and the newest grow or shrink's, as logged
    last_record: dict[str, Any] | None = None
    last_change_record: dict[str, Any] | None = None
    #: when the next decision is due (``time.monotonic``)
    next_at: float = 0.0
    _next_index: int = 0

    def __post_init__(self) -> None:
        self.autoscaler = Autoscaler(self.recipe.autoscale)
        self._next_index = self.recipe.rollout.nodes
        self.gpn = groups_per_node(self.recipe.rollout.concurrency, self.recipe.tasks.group_size)

    def step(
        self, st: DataflowStatus | None, nodes: list[NodeService], restarting: set[str]
    ) -> list[NodeService]:
        """One interval: reap drained nodes, decide, act. ``nodes``: the launcher's node
        services; ``restarting``: names whose crash restart is scheduled (still in the pool).
        Returns the nodes it started (the launcher's ``start_node`` has added them)."""
        now = time.monotonic()
        if st is None or now < self.next_at:
            return []
        self.next_at = now + self.recipe.autoscale.interval_s
        for name, svc in list(self.draining.items()):
            code = svc.returncode()
            if code is not None:
                del self.draining[name]
                release = getattr(svc, "release", None)
                if release is not None:  # a Ray actor: free what it reserves for a grown node
                    release()
                self.log.write({"event": "left", "node": name, "returncode": code})
        pool = {
            s.name
            for s in nodes
            if s.name not in self.retired and (s.returncode() is None or s.name in restarting)
        }
        f = figures(st, pool=pool, draining=set(self.draining), groups_per_node=self.gpn)
        d = self.autoscaler.decide(f, time.time())
        record: dict[str, Any] = {"time": time.time(), "decision": d.action, "reason": d.reason,
                                  "pool": d.pool, "target": d.target,
                                  "figures": f.as_dict()}  # fmt: skip
        started: list[NodeService] = []
        for _ in range(max(0, d.target - d.pool)):
            try:
                started.append(self.start_node(self._next_index))
            except Exception as exc:  # e.g. no Ray node can place another actor: run on
                record["error"] = f"could not start node-{self._next_index}: {exc}"[:2000]
                break
            finally:
                self._next_index += 1
        left = [s for s in nodes if s.name in pool]
        drained: list[NodeService] = []
        for _ in range(max(0, d.pool - d.target)):
            victim = self._victim(st, left)
            if victim is None:
                break
            left.remove(victim)
            victim.drain()
            self.draining[victim.name] = victim
            self.retired.add(victim.name)
            drained.append(victim)
        changed = started or drained
        if changed:
            record.update(nodes=[s.name for s in changed], pids=[s.pid for s in changed])
            self.last_change_record = record
        elif d.action != "hold":
            why = "no node started" if d.action == "grow" else "no node to drain"
            record.update(decision="hold", reason=f"{d.reason}; {why}", target=d.pool)
        self.last_record = record
        self.log.write(record)
        return started

    @staticmethod
    def _victim(st: DataflowStatus, pool: list[NodeService]) -> NodeService | None:
        """The node with the fewest active leases (least work to finish or hand back), the
        newest among equals."""
        leases = {n.name: n.active_leases for n in st.nodes if n.state == "active"}

        def key(s: NodeService) -> tuple[int, int]:
            index = s.name.removeprefix("node-")
            return (leases.get(s.name, 0), -int(index) if index.isdigit() else 0)

        return min(pool, key=key, default=None)

    def line(self) -> str | None:
        """The live view's line (see :func:`describe`)."""
        if self.last_record is None:
            return None
        return describe(self.last_record, self.last_change_record, len(self.draining))


def describe(
    last: dict[str, Any], change: dict[str, Any] | None, draining: int, now: float | None = None
) -> str:
    """One line from ``autoscale.jsonl`` records: the pool, the figures the newest decision read,
    that decision and the last change. The launcher's live view and ``astraflow status
    --run-dir`` both draw it."""
    f = last.get("figures", {})
    idle = f.get("trainer_idle")
    fill = f.get("buffer_fill")
    slots = f.get("nodes", 0) * f.get("groups_per_node", 1)
    text = f"autoscale: pool {last.get('target')}" + (f" ({draining} draining)" if draining else "")
    text += f" · trainer idle {'-' if idle is None else f'{idle:.2f}'}"
    if fill is not None:
        text += f" · buffer fill {fill:.2f}"
    text += f" · {f.get('in_flight', 0)}/{slots} group slots in flight"
    text += f" · {last.get('decision')}: {last.get('reason')}"
    if change is not None:
        ago = (time.time() if now is None else now) - float(change.get("time", 0.0))
        text += f" · last change: {change['decision']} to {change['target']} {ago:.0f}s ago"
    return text


def describe_log(path: Path) -> str | None:
    """:func:`describe` of a run's ``autoscale.jsonl`` (None when the run has none)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    last = change = None
    draining: set[str] = set()
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a line being written
        if r.get("event") == "left":
            draining.discard(r.get("node"))
        elif "decision" in r:
            last = r
            if r["decision"] in ("grow", "shrink"):
                change = r
            if r["decision"] == "shrink":
                draining.update(r.get("nodes", []))
    return None if last is None else describe(last, change, len(draining))
