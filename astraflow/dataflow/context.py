"""Everything an operation needs besides the transaction: config, policies, feeder, metrics log."""

from __future__ import annotations

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

    def now(self) -> float:
        return self.config.clock()
