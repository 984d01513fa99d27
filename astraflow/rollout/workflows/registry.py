"""Workflow registry: built-ins plus third-party workflows from the ``astraflow.workflows`` group.

A plugin entry point names either a workflow function (registered under the entry-point name, with
its roles read from a ``roles`` attribute) or a :class:`WorkflowSpec`.
"""

from __future__ import annotations

from typing import Any

from astraflow.plugins import LoadedEntryPoint
from astraflow.registry import Registry
from astraflow.rollout.workflows.base import WorkflowError, WorkflowSpec

GROUP = "astraflow.workflows"


def _builtin_specs() -> list[WorkflowSpec]:
    from astraflow.rollout.workflows.single_agent import single_agent

    specs = [
        WorkflowSpec(
            "single_agent",
            single_agent,
            ("agent",),
            "One policy, multi-turn loop over any registered env",
            resumable=True,
        )
    ]
    from astraflow.rollout.workflows import game, multi_agent, openai_agent, tool_agent

    return specs + list(multi_agent.SPECS) + [openai_agent.spec(), tool_agent.SPEC, game.SPEC]


def _accept_workflow(obj: Any, ep: LoadedEntryPoint) -> WorkflowSpec:
    """A :class:`WorkflowSpec` as is; a workflow function as a spec named after its entry point."""
    if isinstance(obj, WorkflowSpec):
        return obj
    if not callable(obj):
        raise TypeError(f"expected a WorkflowSpec or a workflow function, got {obj!r}")
    roles = tuple(getattr(obj, "roles", ("agent",)))
    summary = (obj.__doc__ or "").strip().split("\n")[0]
    return WorkflowSpec(ep.name, obj, roles, summary, ep.dist)


class WorkflowRegistry(Registry[WorkflowSpec]):
    """Workflow specs by name: the built-ins, then the ``astraflow.workflows`` plugins."""

    def __init__(self, group: str = GROUP) -> None:
        super().__init__(
            "workflow",
            lambda spec: spec.name,
            group=group,
            builtins=_builtin_specs,
            unpack=lambda ep: [ep.obj],
            accept=_accept_workflow,
            origin=lambda spec: spec.source,
            unknown_error=WorkflowError,
        )

    def add(self, spec: WorkflowSpec) -> None:
        """Put ``spec`` under its name, over any spec already there (a test's wrapped built-in);
        plugins go through :meth:`register`, which refuses a taken name."""
        self.replace(spec)

    def specs(self) -> list[WorkflowSpec]:
        return self.items()

    async def aclose(self) -> None:
        """Release what workflow objects hold (the ``openai_agent`` endpoint of a node)."""
        for spec in self.items():
            close = getattr(spec.fn, "aclose", None)
            if close is not None:
                await close()


def default_workflows() -> WorkflowRegistry:
    return WorkflowRegistry().discover()
