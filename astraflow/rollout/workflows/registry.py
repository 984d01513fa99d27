"""Workflow registry: built-ins plus third-party workflows from the ``astraflow.workflows`` group.

A plugin entry point names either a workflow function (registered under the entry-point name, with
its roles read from a ``roles`` attribute) or a :class:`WorkflowSpec`.
"""

from __future__ import annotations

import difflib
from importlib.metadata import entry_points

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
        )
    ]
    from astraflow.rollout.workflows import multi_agent, openai_agent

    return specs + list(multi_agent.SPECS) + [openai_agent.spec()]


class WorkflowRegistry:
    def __init__(self) -> None:
        self._specs: dict[str, WorkflowSpec] = {}
        self.errors: dict[str, str] = {}

    def add(self, spec: WorkflowSpec) -> None:
        self._specs[spec.name] = spec

    def discover(self) -> WorkflowRegistry:
        for spec in _builtin_specs():
            self.add(spec)
        for ep in entry_points(group=GROUP):
            try:
                obj = ep.load()
                if isinstance(obj, WorkflowSpec):
                    self.add(obj)
                else:
                    roles = tuple(getattr(obj, "roles", ("agent",)))
                    src = ep.dist.name if ep.dist is not None else "plugin"
                    self.add(
                        WorkflowSpec(
                            ep.name, obj, roles, (obj.__doc__ or "").strip().split("\n")[0], src
                        )
                    )
            except Exception as exc:  # a broken plugin must not take the node down
                self.errors[ep.name] = f"{type(exc).__name__}: {exc}"
        return self

    def get(self, name: str) -> WorkflowSpec:
        try:
            return self._specs[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self._specs), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise WorkflowError(
                f"unknown workflow {name!r}{hint} (known: {', '.join(sorted(self._specs))})"
            ) from None

    async def aclose(self) -> None:
        """Release what workflow objects hold (the ``openai_agent`` endpoint of a node)."""
        for spec in self._specs.values():
            close = getattr(spec.fn, "aclose", None)
            if close is not None:
                await close()

    def specs(self) -> list[WorkflowSpec]:
        return sorted(self._specs.values(), key=lambda s: s.name)


def default_workflows() -> WorkflowRegistry:
    return WorkflowRegistry().discover()
