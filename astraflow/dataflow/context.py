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


@dataclass
class Context:
    config: ServiceConfig
    pipeline: Pipeline
    feeder: TaskFeeder
    metrics: MetricsLog
    #: async or lock-step (``run.mode``): every point where the two differ
    mode: RunMode
    #: Called (on the store's writer thread, after the commit) when an operation put tasks back
    #: on the queue; the service sets it to wake parked lease requests. Must be thread-safe.
    wake: Callable[[], None] | None = None

    def now(self) -> float:
        return self.config.clock()
