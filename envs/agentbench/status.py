"""Outcome vocabulary shared by the AgentBench envs and astraflow.rollout.evaluation.

The statuses are AgentBench v0.2's sample statuses, so reports read the same as AgentBench's;
``skipped`` is ours: a sample whose set-up needs something this machine's sandbox cannot offer.
"""

from __future__ import annotations

from enum import Enum

from astraflow.envs.base import TaskError


class SampleStatus(str, Enum):  # noqa: UP042 (StrEnum would change str(member), which reports use)
    RUNNING = "running"
    COMPLETED = "completed"
    AGENT_CONTEXT_LIMIT = "agent context limit"
    AGENT_VALIDATION_FAILED = "agent validation failed"
    AGENT_INVALID_ACTION = "agent invalid action"
    TASK_LIMIT_REACHED = "task limit reached"
    TASK_ERROR = "task error"
    UNKNOWN = "unknown"
    SKIPPED = "skipped"


class TaskSkipped(TaskError):
    """The sample cannot run here (e.g. it needs network); reported as skipped with this reason."""
