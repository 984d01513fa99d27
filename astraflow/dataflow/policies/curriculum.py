"""Curriculum from online pass rates: task sets (difficulty levels, buckets) drawn by how learnable
they are right now.

Why pass rates: a GRPO group teaches only when its rewards differ, which for pass/fail rewards is
most likely at a pass rate near 1/2 and impossible at 0 or 1. So a set whose running pass rate is
inside ``band`` keeps its recipe weight, a set outside it (mastered, or not yet reachable) is drawn
at ``floor`` times its weight: still drawn, so its rate is re-measured as the policy changes.
"""

from __future__ import annotations

from typing import Any

from astraflow.dataflow.policies.base import (
    AdaptiveMixing,
    GroupObserver,
    GroupView,
    PolicyConfigError,
)


class PassRateCurriculum(AdaptiveMixing, GroupObserver):
    """``weight(set) = recipe weight x (1 if band[0] <= pass_rate <= band[1] else floor)``.

    ``pass_rate`` is a decayed count: after each group of set s, ``n = n * decay + size`` and
    ``passes = passes * decay + (rewards >= success)``; the rate is ``(passes + 1) / (n + 2)``
    (Laplace prior: an unseen set starts at 1/2, inside the band, so it is tried first).
    """

    name = "curriculum"
    description = "draw task sets by running pass rate, favouring the learnable band"

    def __init__(
        self,
        band: list[float] | tuple[float, float] = (0.15, 0.85),
        floor: float = 0.1,
        decay: float = 0.9,
        success: float = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (
            not isinstance(band, (list, tuple))
            or len(band) != 2
            or not all(isinstance(x, (int, float)) for x in band)
            or not 0.0 <= band[0] < band[1] <= 1.0
        ):
            raise PolicyConfigError(
                f"curriculum: band must be [low, high] with 0 <= low < high <= 1, got {band!r}"
            )
        if not isinstance(floor, (int, float)) or not 0.0 < floor <= 1.0:
            raise PolicyConfigError(f"curriculum: floor must be in (0, 1], got {floor!r}")
        if not isinstance(decay, (int, float)) or not 0.0 < decay <= 1.0:
            raise PolicyConfigError(f"curriculum: decay must be in (0, 1], got {decay!r}")
        if not isinstance(success, (int, float)):
            raise PolicyConfigError(f"curriculum: success must be a number, got {success!r}")
        self.band = (float(band[0]), float(band[1]))
        self.floor = float(floor)
        self.decay = float(decay)
        self.success = float(success)
        #: task set -> [decayed samples, decayed passes]
        self.counts: dict[str, list[float]] = {}
        self._changed: set[str] = set()

    def pass_rate(self, task_set: str) -> float:
        n, passes = self.counts.get(task_set, (0.0, 0.0))
        return (passes + 1.0) / (n + 2.0)

    def factor(self, task_set: str) -> float:
        low, high = self.band
        return 1.0 if low <= self.pass_rate(task_set) <= high else self.floor

    def weights(self, weights: dict[str, float]) -> dict[str, float]:
        return {name: w * self.factor(name) for name, w in weights.items()}

    def observe(self, group: GroupView) -> None:
        if not group.rewards:
            return
        n, passes = self.counts.get(group.task_set, (0.0, 0.0))
        passed = sum(1 for r in group.rewards if r >= self.success)
        self.counts[group.task_set] = [
            n * self.decay + len(group.rewards),
            passes * self.decay + passed,
        ]
        self._changed.add(group.task_set)

    def state_changes(self) -> dict[str, Any]:
        out = {k: self.counts[k] for k in self._changed}
        self._changed.clear()
        return out

    def load_state(self, entries: dict[str, Any]) -> None:
        for key, value in entries.items():
            self.counts[key] = [float(value[0]), float(value[1])]
