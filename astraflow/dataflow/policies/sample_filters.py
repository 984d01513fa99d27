"""Batching-stage policies: what a trainer receives from its buffer."""

from __future__ import annotations

from typing import Any

from astraflow.dataflow.policies.base import PolicyConfigError, SampleFilter, SampleView


class StalenessBound(SampleFilter):
    """Samples whose oldest generated token is more than ``max_staleness`` versions behind the
    trainer are dropped (``action="drop"``, counted as ``stale``) or kept with a loss weight of
    ``decay ** (staleness - max_staleness)`` (``action="weight"``)."""

    name = "staleness"
    description = "drop or down-weight samples more than k versions old"

    def __init__(
        self, max_staleness: int = 4, action: str = "drop", decay: float = 0.5, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(max_staleness, int) or max_staleness < 0:
            raise PolicyConfigError(
                f"staleness: max_staleness must be an integer >= 0, got {max_staleness!r}"
            )
        if action not in ("drop", "weight"):
            raise PolicyConfigError(f"staleness: action must be 'drop' or 'weight', got {action!r}")
        if not isinstance(decay, (int, float)) or not 0.0 <= decay <= 1.0:
            raise PolicyConfigError(f"staleness: decay must be in [0, 1], got {decay!r}")
        self.max_staleness = max_staleness
        self.action = action
        self.decay = float(decay)

    def apply(self, sample: SampleView, trainer_version: int) -> str | None:
        excess = sample.staleness(trainer_version) - self.max_staleness
        if excess <= 0:
            return None
        if self.action == "drop":
            return "stale"
        sample.weight *= self.decay**excess
        return None
