"""Ingestion-stage policies: decide whether a complete group enters the buffer."""

from __future__ import annotations

from typing import Any

from astraflow.dataflow.policies.base import GroupFilter, GroupView, PolicyConfigError


class ZeroVarianceFilter(GroupFilter):
    """DAPO dynamic sampling: a group whose rewards are all equal has zero GRPO advantage, so it
    only costs trainer compute. Dropped samples are counted as ``zero_variance``."""

    name = "zero_variance_filter"
    description = "drop groups whose rewards are all equal (DAPO dynamic sampling)"

    def __init__(self, tolerance: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(tolerance, (int, float)) or tolerance < 0:
            raise PolicyConfigError(
                f"zero_variance_filter: tolerance must be a number >= 0, got {tolerance!r}"
            )
        self.tolerance = float(tolerance)

    def drop_reason(self, group: GroupView) -> str | None:
        if not group.rewards:
            return None
        if max(group.rewards) - min(group.rewards) <= self.tolerance:
            return "zero_variance"
        return None
