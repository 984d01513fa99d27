"""Composable dataflow policies (selection, ingestion, batching) and their registry."""

from astraflow.dataflow.policies.base import (
    DataflowPolicy,
    GroupFilter,
    GroupView,
    MixingPolicy,
    OrderingPolicy,
    PolicyConfigError,
    SampleFilter,
    SampleView,
    TaskView,
)
from astraflow.dataflow.policies.registry import POLICY_GROUP, Pipeline, PolicyRegistry

__all__ = [
    "POLICY_GROUP",
    "DataflowPolicy",
    "GroupFilter",
    "GroupView",
    "MixingPolicy",
    "OrderingPolicy",
    "Pipeline",
    "PolicyConfigError",
    "PolicyRegistry",
    "SampleFilter",
    "SampleView",
    "TaskView",
]
