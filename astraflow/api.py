"""Every contract a plugin implements, importable from one place.

A package that adds an environment, a task set, a workflow, a dataflow policy, a tool-call parser
or an inference engine imports what it implements from here, and registers it through the
entry-point group named beside it (``docs/plugins.md``)::

    from astraflow.api import EnvSpec, TaskSetInfo, TextEnv

The names are re-exported from the modules that define them; this module adds nothing of its own,
so a contract is still written once.
"""

from __future__ import annotations

from astraflow.dataflow.policies.base import (
    DataflowPolicy,
    GroupFilter,
    GroupView,
    MixingPolicy,
    OrderingPolicy,
    SampleFilter,
    SampleView,
    TaskGate,
    TaskView,
)
from astraflow.dataflow.policies.registry import POLICY_GROUP
from astraflow.envs.base import StateMixin, TaskError, TextEnv
from astraflow.envs.registry import ENV_GROUP
from astraflow.envs.spec import EnvSpec
from astraflow.protocol import Episode, Task
from astraflow.rollout.engines.base import Engine, Generation, SamplingParams, WeightUpdate
from astraflow.rollout.workflows.base import EpisodeSaver, RolePolicy, Workflow, WorkflowSpec
from astraflow.rollout.workflows.registry import GROUP as WORKFLOW_GROUP
from astraflow.tasks.base import TaskSetInfo
from astraflow.tasks.catalog import TASKS_GROUP
from astraflow.tools.parsers import GROUP as TOOL_PARSER_GROUP
from astraflow.tools.parsers import ToolParser

__all__ = [
    # environments (entry-point group "astraflow.envs")
    "ENV_GROUP",
    "EnvSpec",
    "StateMixin",
    "TaskError",
    "TextEnv",
    # task sets ("astraflow.tasks")
    "TASKS_GROUP",
    "TaskSetInfo",
    # workflows ("astraflow.workflows")
    "WORKFLOW_GROUP",
    "Episode",
    "EpisodeSaver",
    "RolePolicy",
    "Task",
    "Workflow",
    "WorkflowSpec",
    # dataflow policies ("astraflow.policies")
    "POLICY_GROUP",
    "DataflowPolicy",
    "GroupFilter",
    "GroupView",
    "MixingPolicy",
    "OrderingPolicy",
    "SampleFilter",
    "SampleView",
    "TaskGate",
    "TaskView",
    # tool-call parsers ("astraflow.tool_parsers")
    "TOOL_PARSER_GROUP",
    "ToolParser",
    # inference engines
    "Engine",
    "Generation",
    "SamplingParams",
    "WeightUpdate",
]
