"""Registry of dataflow policies (built-ins plus the ``astraflow.policies`` entry-point group).

A third-party package exposes a callable through the entry-point group; it receives nothing and
returns (or yields) :class:`~astraflow.dataflow.policies.base.DataflowPolicy` subclasses. Recipes
then name them in ``[[dataflow.policies]]`` exactly like the built-ins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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
    TaskGate,
    TaskView,
)
from astraflow.dataflow.policies.group_replay import GroupReplay
from astraflow.dataflow.policies.selection import FifoOrder
from astraflow.plugins import LoadedEntryPoint
from astraflow.registry import Registry

POLICY_GROUP = "astraflow.policies"


def builtin_policies() -> list[type[DataflowPolicy]]:
    """Entry point of the built-ins (registered in pyproject.toml like any plugin)."""
    from astraflow.dataflow.policies.curriculum import PassRateCurriculum
    from astraflow.dataflow.policies.group_filters import ZeroVarianceFilter
    from astraflow.dataflow.policies.sample_filters import StalenessBound
    from astraflow.dataflow.policies.selection import (
        EarliestDeadlineFirst,
        FifoOrder,
        PriorityOrder,
        TaskSetMixing,
    )
    from astraflow.dataflow.policies.skipping import PredictiveSkip

    return [
        FifoOrder,
        PriorityOrder,
        EarliestDeadlineFirst,
        TaskSetMixing,
        ZeroVarianceFilter,
        StalenessBound,
        PassRateCurriculum,
        PredictiveSkip,
        GroupReplay,
    ]


def _accept_policy(obj: Any, _ep: LoadedEntryPoint) -> type[DataflowPolicy]:
    if not (isinstance(obj, type) and issubclass(obj, DataflowPolicy)):
        raise TypeError(f"expected DataflowPolicy subclasses, got {obj!r}")
    return obj


class PolicyRegistry(Registry[type[DataflowPolicy]]):
    """Policy classes by ``name``: the built-ins, then the ``astraflow.policies`` plugins (the
    built-ins are also published there; registering the same class twice is a no-op)."""

    def __init__(self, group: str = POLICY_GROUP) -> None:
        super().__init__(
            "dataflow policy",
            lambda cls: cls.name,
            group=group,
            builtins=builtin_policies,
            accept=_accept_policy,
            origin=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
            unknown_error=PolicyConfigError,
        )

    def add(self, cls: type[DataflowPolicy]) -> None:
        if not cls.name:
            raise PolicyConfigError(f"{cls.__name__} has no name")
        self.register(cls)

    def build(self, name: str, kwargs: dict[str, Any]) -> DataflowPolicy:
        cls = self.get(name)
        try:
            return cls(**kwargs)
        except PolicyConfigError:
            raise
        except TypeError as exc:
            raise PolicyConfigError(
                f"dataflow policy {name!r}: bad kwargs {kwargs}: {exc}"
            ) from None


@dataclass
class Pipeline:
    """The configured policies of one run, grouped by what the service asks of them."""

    task_order: OrderingPolicy = field(default_factory=FifoOrder)
    group_order: OrderingPolicy = field(default_factory=lambda: FifoOrder(stage="batching"))
    mixing: list[MixingPolicy] = field(default_factory=list)
    group_filters: list[GroupFilter] = field(default_factory=list)
    sample_filters: list[SampleFilter] = field(default_factory=list)
    #: policies that may skip a pending task at lease time (predictive skipping, late deadlines)
    gates: list[TaskGate] = field(default_factory=list)
    #: task-set weights that change during the run (curriculum)
    adaptive: list[AdaptiveMixing] = field(default_factory=list)
    #: policies that learn from every complete group; their state is kept in the store
    observers: list[GroupObserver] = field(default_factory=list)
    replay: GroupReplay | None = None
    all: list[DataflowPolicy] = field(default_factory=list)

    @classmethod
    def from_config(
        cls, configs: Iterable[Any], registry: PolicyRegistry | None = None
    ) -> Pipeline:
        """Build from ``recipe.dataflow.policies`` (objects with ``name`` and ``kwargs``)."""
        registry = registry or PolicyRegistry()
        pipe = cls()
        for cfg in configs:
            policy = registry.build(cfg.name, dict(cfg.kwargs))
            pipe.add(policy)
        return pipe

    def add(self, policy: DataflowPolicy) -> None:
        """File ``policy`` under every interface it implements (one object may have several
        jobs' hooks, e.g. EDF orders tasks and may skip late ones)."""
        known = False
        if isinstance(policy, OrderingPolicy):
            known = True
            if policy.stage == "batching":
                self.group_order = policy
            else:
                self.task_order = policy
        if isinstance(policy, MixingPolicy):
            known = True
            self.mixing.append(policy)
        if isinstance(policy, AdaptiveMixing):
            known = True
            self.adaptive.append(policy)
        if isinstance(policy, GroupFilter):
            known = True
            self.group_filters.append(policy)
        if isinstance(policy, SampleFilter):
            known = True
            self.sample_filters.append(policy)
        if isinstance(policy, TaskGate):
            known = True
            self.gates.append(policy)
        if isinstance(policy, GroupReplay):
            if self.replay is not None:
                raise PolicyConfigError("dataflow policy 'replay' is listed twice")
            known = True
            self.replay = policy
        if isinstance(policy, GroupObserver):
            self.observers.append(policy)
        if not known:
            raise PolicyConfigError(
                f"dataflow policy {policy.name!r} ({type(policy).__name__}) implements no known "
                "stage interface (OrderingPolicy, MixingPolicy, AdaptiveMixing, GroupFilter, "
                "SampleFilter, TaskGate, GroupReplay)"
            )
        self.all.append(policy)

    def skip_reason(self, task: TaskView, now: float) -> str | None:
        """The first gate's reason to skip ``task``, or None to run it."""
        for gate in self.gates:
            reason = gate.skip_reason(task, now)
            if reason:
                return reason
        return None

    def adaptive_weights(self, weights: dict[str, float]) -> dict[str, float]:
        for m in self.adaptive:
            weights = m.weights(weights)
        return weights

    def observe(self, group: GroupView) -> None:
        for o in self.observers:
            o.observe(group)

    def observer_key(self, observer: GroupObserver) -> str:
        """Stable store key of an observer's state: its position in the recipe and its name."""
        i = next(i for i, p in enumerate(self.all) if p is observer)
        return f"{i}:{observer.name}"

    def set_weights(self, weights: dict[str, float]) -> dict[str, float]:
        for m in self.mixing:
            weights = m.weights(weights)
        return weights

    def describe(self) -> list[dict[str, str]]:
        return [{"name": p.name, "stage": p.stage} for p in self.all]
