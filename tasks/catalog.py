"""The built-in catalogue of task sets (a fresh registry per call; no module-level state)."""

from __future__ import annotations

from typing import Any

from tasks import arith
from tasks.base import Payload, TaskSetInfo, TaskSetRegistry


def default_task_sets() -> TaskSetRegistry:
    reg = TaskSetRegistry()
    reg.add(TaskSetInfo("arith", arith.generate, ("train", "test"),
                        "Generated integer arithmetic (levels 1-3), sized for CPU RL",
                        "astraflow/Math-v0"))
    return reg


def load_task_set(name: str, split: str = "train", *, seed: int = 0, limit: int | None = None,
                  **kwargs: Any) -> list[Payload]:
    """Payloads of task set ``name`` (see :mod:`tasks.base`)."""
    return default_task_sets().load(name, split, seed=seed, limit=limit, **kwargs)
