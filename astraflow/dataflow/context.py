"""Everything an operation needs besides the transaction: config, policies, feeder, metrics log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.feeder import TaskFeeder
from astraflow.dataflow.metrics import MetricsLog
from astraflow.dataflow.policies import Pipeline


@dataclass
class Context:
    config: ServiceConfig
    pipeline: Pipeline
    feeder: TaskFeeder
    metrics: MetricsLog
    #: Called (on the store's writer thread, after the commit) when an operation put tasks back
    #: on the queue; the service sets it to wake parked lease requests. Must be thread-safe.
    wake: Callable[[], None] | None = None

    def now(self) -> float:
        return self.config.clock()
