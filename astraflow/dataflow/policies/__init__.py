"""Composable dataflow policies (selection, ingestion, batching) and their registry."""

from astraflow.dataflow.policies.base import (
    AdaptiveMixing,
    DataflowPolicy,
    GroupFilter,
    GroupObserver,
    GroupView,
    MixingPolicy,
    OrderingPolicy,
    PolicyConfigError,
    SampleFilter,
    SampleView,
    TaskGate,
    TaskView,
)
from astraflow.dataflow.policies.registry import POLICY_GROUP, Pipeline, PolicyRegistry

__all__ = [
    "POLICY_GROUP",
    "AdaptiveMixing",
    "DataflowPolicy",
    "GroupFilter",
    "GroupObserver",
    "GroupView",
    "MixingPolicy",
    "OrderingPolicy",
    "Pipeline",
    "PolicyConfigError",
    "PolicyRegistry",
    "SampleFilter",
    "SampleView",
    "TaskGate",
    "TaskView",
]
