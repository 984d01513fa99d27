"""Selection-stage policies: task ordering (FIFO, priority, earliest deadline) and set mixing."""

from __future__ import annotations

import math
import random
from typing import Any

from astraflow.dataflow.policies.base import (
    GroupView,
    MixingPolicy,
    OrderingPolicy,
    PolicyConfigError,
    TaskGate,
    TaskView,
)


class FifoOrder(OrderingPolicy):
    """Oldest first (enqueue order for tasks, completion order for groups). The default."""

    name = "fifo"
    description = "oldest task/group first"
    enqueue_order = True

    def sort_key(self, item: TaskView | GroupView) -> tuple:
        return (item.seq,)


class PriorityOrder(OrderingPolicy):
    """Highest ``priority`` first, FIFO among equals."""

    name = "priority"
    description = "highest priority first, then FIFO"

    def sort_key(self, item: TaskView | GroupView) -> tuple:
        return (-item.priority, item.seq)


class EarliestDeadlineFirst(OrderingPolicy, TaskGate):
    """Earliest ``deadline`` first; items without a deadline come last, FIFO among equals.

    Deadlines are absolute clock times set when a task is enqueued: ``now + deadline_s`` from the
    task set's ``deadline_s`` in ``[tasks].sets`` or a task payload's own ``deadline_s`` (which
    wins). With ``drop_expired = true`` (selection stage) a task still pending after its deadline
    is not started at all and counted as ``deadline_expired`` (its result would come too late to
    matter, e.g. a stale-by-design streaming task), instead of being served first."""

    name = "edf"
    description = "earliest deadline first (no deadline last), then FIFO; optionally drop late"

    def __init__(self, stage: str = "selection", drop_expired: bool = False, **kwargs: Any) -> None:
        super().__init__(stage=stage, **kwargs)
        if not isinstance(drop_expired, bool):
            raise PolicyConfigError(
                f"edf: drop_expired must be true or false, got {drop_expired!r}"
            )
        if drop_expired and stage != "selection":
            raise PolicyConfigError("edf: drop_expired applies to the selection stage only")
        self.drop_expired = drop_expired

    def sort_key(self, item: TaskView | GroupView) -> tuple:
        deadline = math.inf if item.deadline is None else item.deadline
        return (deadline, item.seq)

    def skip_reason(self, task: TaskView, now: float) -> str | None:
        if self.drop_expired and task.deadline is not None and task.deadline < now:
            return "deadline_expired"
        return None


class TaskSetMixing(MixingPolicy):
    """Overrides the recipe's per-set ``weight``: ``weights = {set_name: ratio, ...}``.

    The feeder then interleaves sets deterministically so that after n tasks every set has been
    drawn as close to ``n * ratio / sum(ratios)`` times as integers allow.
    """

    name = "mixing"
    description = "mixing ratios across task sets"

    def __init__(self, weights: dict[str, float] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(weights, dict) or not weights:
            raise PolicyConfigError(
                "dataflow policy 'mixing' needs kwargs.weights = {task_set = ratio, ...}"
            )
        for name, w in weights.items():
            if not isinstance(w, (int, float)) or w < 0:
                raise PolicyConfigError(
                    f"dataflow policy 'mixing': weight of {name!r} must be a number >= 0, got {w!r}"
                )
        self.ratios = {str(k): float(v) for k, v in weights.items()}

    def weights(self, weights: dict[str, float]) -> dict[str, float]:
        unknown = set(self.ratios) - set(weights)
        if unknown:
            raise PolicyConfigError(
                f"dataflow policy 'mixing' names task sets {sorted(unknown)} that are not in "
                f"[tasks].sets ({', '.join(sorted(weights))})"
            )
        out = {name: self.ratios.get(name, w) for name, w in weights.items()}
        if not any(v > 0 for v in out.values()):
            raise PolicyConfigError("dataflow policy 'mixing': at least one weight must be > 0")
        return out


def pick_set(weights: dict[str, float], emitted: dict[str, int], available: list[str]) -> str:
    """The set whose share lags its ratio most (deterministic; ties go to the earlier set)."""
    best, best_score = None, math.inf
    for name in available:
        w = weights.get(name, 0.0)
        if w <= 0:
            continue
        score = (emitted.get(name, 0) + 1) / w
        if score < best_score:
            best, best_score = name, score
    if best is None:
        raise LookupError("no task set with a positive weight is available")
    return best


def draw_set(weights: dict[str, float], available: list[str], seed: str) -> str:
    """A set drawn at random in proportion to ``weights`` (adaptive mixing), seeded by ``seed``."""
    names = [n for n in available if weights.get(n, 0.0) > 0]
    if not names:
        raise LookupError("no task set with a positive weight is available")
    total = sum(weights[n] for n in names)
    x = random.Random(seed).random() * total
    for name in names:
        x -= weights[name]
        if x < 0:
            return name
    return names[-1]
