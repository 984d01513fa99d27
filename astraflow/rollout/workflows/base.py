"""Workflow contract: an async function that runs one episode of a task with policies by role.

A workflow sees each role through a :class:`RolePolicy` (the engine serving that role's policy, its
tokenizer and sampling settings) and creates envs through an ``EnvFactory``. It returns one
:class:`~astraflow.protocol.Episode`; the node runs ``task.group_size`` of them per task. Workflows
never talk to the dataflow service or the weight store: they are pure rollout logic, which is what
lets third parties add their own through the ``astraflow.workflows`` entry-point group.

Envs are async to a workflow: ``env = await make_env(env_id, kwargs)`` returns an
:class:`~astraflow.rollout.env_runner.AsyncEnv`, and every call on it is awaited
(``await env.reset(seed=..., options=...)``, ``await env.step(action)``, ``await env.close()``,
the latter in a ``finally``). The node runs sync envs in a bounded thread pool and awaits envs
with ``areset``/``astep``/``aclose`` natively, each call bounded by ``rollout.env_timeout_s``; a
call past that raises :class:`~astraflow.rollout.env_runner.EnvCallTimeout`, which a workflow
should let propagate (the node records the episode as ``finish_reason="env_timeout"``). A
workflow must never call a sync env method itself: that would block every episode on the node.
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


#: ``await make_env(env_id, kwargs)`` -> an ``AsyncEnv`` (see the module docstring). On a node this
#: is :meth:`astraflow.rollout.env_runner.EnvRunner.make`.
EnvFactory = Callable[[str, dict[str, Any]], Awaitable[Any]]


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
