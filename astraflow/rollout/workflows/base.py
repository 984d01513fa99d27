"""Workflow contract: an async function that runs one episode of a task with policies by role.

A workflow sees each role through a :class:`RolePolicy` (the engine serving that role's policy, its
tokenizer and sampling settings) and creates envs through an ``EnvFactory``. It returns one
:class:`~astraflow.protocol.Episode`; the node runs ``task.group_size`` of them per task. Workflows
never talk to the dataflow service or the weight store: they are pure rollout logic, which is what
lets third parties add their own through the ``astraflow.workflows`` entry-point group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from astraflow.protocol import Episode, Task
from astraflow.rollout.engines.base import Engine, SamplingParams


@dataclass
class RolePolicy:
    """What a workflow needs to act as one role."""

    policy: str
    engine: Engine
    sampling: SamplingParams
    trainable: bool = True

    @property
    def tokenizer(self):
        return self.engine.tokenizer


EnvFactory = Callable[[str, dict[str, Any]], Any]


class Workflow(Protocol):
    def __call__(
        self,
        task: Task,
        policies: Mapping[str, RolePolicy],
        make_env: EnvFactory,
        **kwargs: Any,
    ) -> Awaitable[Episode]: ...


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    fn: Workflow
    roles: tuple[str, ...]
    description: str = ""
    source: str = "astraflow"
    defaults: dict[str, Any] = field(default_factory=dict)


class WorkflowError(RuntimeError):
    """A workflow that cannot run as configured (missing role, bad kwargs)."""
