"""Everything an operation needs besides the transaction: config, policies, feeder, metrics log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.feeder import TaskFeeder
from astraflow.dataflow.metrics import MetricsLog
from astraflow.dataflow.policies import Pipeline

if TYPE_CHECKING:  # modes imports the operations, which import this module
    from astraflow.dataflow.modes import RunMode
    from astraflow.dataflow.store import Tx


@dataclass
class Context:
    config: ServiceConfig
    pipeline: Pipeline
    feeder: TaskFeeder
    metrics: MetricsLog
    #: async or lock-step (``run.mode``): every point where the two differ
    mode: RunMode
    #: Called (on a store thread, once the commit is durable) when an operation changed what a
    #: long poll waits for; the service sets it to wake parked lease and batch requests. Must be
    #: thread-safe.
    wake: Callable[[], None] | None = None

    def now(self) -> float:
        return self.config.clock()

    def wake_after_commit(self, tx: Tx) -> None:
        """Once ``tx`` commits, wake the long polls: it put tasks back on the queue, completed a
        task (a new group, a finished evaluation) or otherwise changed what they wait for.

        The operations that do so are found inside other operations (expiry happens in whichever
        request notices it first; most pushes complete nothing), so the wake-up is attached to
        the transaction rather than to any one endpoint."""
        if self.wake is not None and self.wake not in tx.after_commit:
            tx.after_commit.append(self.wake)
