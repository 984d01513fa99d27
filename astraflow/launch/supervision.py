"""When the launcher restarts a crashed service, and when it gives up.

Every service can come back on its own terms: the dataflow service reopens its store (acknowledged
work is durable), a trainer resumes from its newest checkpoint (the dataflow replays the steps after
it, see :mod:`astraflow.dataflow.ops.timeline`), a rollout node starts fresh (its leases expire and
their tasks are leased again). So a crash costs a restart, not the run, as long as crashes do not
repeat: each service has a budget of restarts, spaced by a backoff that doubles, so a service that
cannot start (a bad recipe, a full disk) fails the run in seconds instead of looping.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

MAX_BACKOFF_S = 60.0


@dataclass
class RestartBudget:
    """Restarts left per service and when each pending one is due (``time.monotonic`` clock)."""

    max_restarts: int
    backoff_s: float
    used: dict[str, int] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)

    def schedule(self, name: str, now: float) -> bool:
        """``name`` crashed: schedule its restart; False when its budget is spent."""
        if name in self.due:
            return True
        n = self.used.get(name, 0)
        if n >= self.max_restarts:
            return False
        self.used[name] = n + 1
        self.due[name] = now + min(MAX_BACKOFF_S, self.backoff_s * (2**n))
        return True

    def ready(self, now: float) -> list[str]:
        """Services whose restart is due now (removed from the schedule)."""
        names = [n for n, at in self.due.items() if at <= now]
        for n in names:
            del self.due[n]
        return names

    def next_due(self) -> float | None:
        return min(self.due.values(), default=None)

    @property
    def total(self) -> int:
        return sum(self.used.values())


@dataclass
class RestartLog:
    """``run_dir/restarts.jsonl``: one line per crash seen and per restart, for people and for
    the chaos benchmark (which checks that every kill it made was answered)."""

    path: Path

    def write(self, event: str, service: str, **fields: object) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"time": time.time(), "event": event, "service": service, **fields})
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
