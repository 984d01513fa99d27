"""Workflows: registry of built-in and plugin workflows (entry-point group ``astraflow.workflows``)."""

from astraflow.rollout.workflows.base import RolePolicy, Workflow, WorkflowError, WorkflowSpec
from astraflow.rollout.workflows.registry import WorkflowRegistry, default_workflows

__all__ = [
    "RolePolicy",
    "Workflow",
    "WorkflowError",
    "WorkflowSpec",
    "WorkflowRegistry",
    "default_workflows",
]
