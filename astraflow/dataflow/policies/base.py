"""Dataflow policy interfaces: small objects with one job, applied at a named stage.

Stages (see docs/architecture.md, "Dataflow service"):

- ``selection``: which task runs next (ordering of pending tasks, mixing ratios across task sets);
- ``ingestion``: what happens to a group when its last episode arrives (filters such as DAPO's
  zero-variance filter);
- ``batching``: what a trainer receives (ordering of ready groups, staleness bounds, weights).

Policies see light views (ids, rewards, versions), never token arrays, so they stay cheap and easy
to test on crafted streams. Every drop is returned as a reason string, which the service counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from astraflow.errors import AstraFlowError


class PolicyConfigError(AstraFlowError, ValueError):
    """A dataflow policy named in a recipe does not exist or got bad kwargs."""


@dataclass
class TaskView:
    """A pending task as selection policies see it."""

    id: str
    task_set: str
    seq: int
    priority: float = 0.0
    deadline: float | None = None


@dataclass
class GroupView:
    """A group (one task, one policy) as ingestion and batching policies see it."""

    id: str
    task_id: str
    policy: str
    task_set: str
    rewards: list[float]
    seq: int = 0
    min_version: int = -1
    priority: float = 0.0
    deadline: float | None = None


@dataclass
class SampleView:
    """One sample at batch time; batching policies may lower ``weight`` or drop it."""

    id: str
    group_id: str
    reward: float
    min_version: int
    weight: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)

    def staleness(self, trainer_version: int) -> int:
        """Versions between the oldest token's weights and the trainer's current weights."""
        if self.min_version < 0:
            return 0
        return max(0, trainer_version - self.min_version)


class DataflowPolicy:
    """Base class. Subclasses set ``name`` and ``stage`` and validate their kwargs in __init__."""

    name: ClassVar[str] = ""
    stage: str = "selection"
    description: ClassVar[str] = ""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs:
            raise PolicyConfigError(
                f"dataflow policy {self.name!r} got unknown kwargs {sorted(kwargs)}"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(stage={self.stage!r})"


class OrderingPolicy(DataflowPolicy):
    """Orders pending tasks (selection stage) or ready groups (batching stage)."""

    #: The order is enqueue order, the order the store keeps pending tasks in: a lease then reads
    #: only the first pending tasks instead of every one of them (FIFO, the default).
    enqueue_order: bool = False

    def __init__(self, stage: str = "selection", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if stage not in ("selection", "batching"):
            raise PolicyConfigError(
                f"dataflow policy {self.name!r}: stage must be 'selection' or 'batching', "
                f"got {stage!r}"
            )
        self.stage = stage

    def sort_key(self, item: TaskView | GroupView) -> tuple:
        raise NotImplementedError


class MixingPolicy(DataflowPolicy):
    """Adjusts the mixing weights of task sets (selection stage)."""

    stage = "selection"

    def weights(self, weights: dict[str, float]) -> dict[str, float]:
        raise NotImplementedError


class GroupFilter(DataflowPolicy):
    """Decides at ingestion whether a complete group is kept (None) or dropped (a reason)."""

    stage = "ingestion"

    def drop_reason(self, group: GroupView) -> str | None:
        raise NotImplementedError


class TaskGate(DataflowPolicy):
    """Selection stage, at lease time: returns a reason to skip a pending task (never rolled out,
    counted as ``group_size`` skipped rollouts under that reason) or None to let it run."""

    stage = "selection"

    def skip_reason(self, task: TaskView, now: float) -> str | None:
        raise NotImplementedError


class AdaptiveMixing(DataflowPolicy):
    """Selection stage: task-set weights that change as groups complete (e.g. a curriculum).

    The feeder asks for the weights before each draw and then draws a set at random in proportion
    (seeded by the run seed and the draw's index, so a restarted service continues the stream)."""

    stage = "selection"

    def weights(self, weights: dict[str, float]) -> dict[str, float]:
        raise NotImplementedError


class GroupObserver:
    """Mixin: the policy learns from every complete training group (kept or filtered).

    Its state must survive a restart of the dataflow service: :meth:`state_changes` returns the
    entries changed since the last call (JSON-able values by string key), which the service writes
    to the store in the same transaction as the group, and :meth:`load_state` restores them."""

    def observe(self, group: GroupView) -> None:
        raise NotImplementedError

    def state_changes(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state(self, entries: dict[str, Any]) -> None:
        raise NotImplementedError


class SampleFilter(DataflowPolicy):
    """At batch time: returns a drop reason, or None to keep (possibly lowering the weight)."""

    stage = "batching"

    def apply(self, sample: SampleView, trainer_version: int) -> str | None:
        raise NotImplementedError
