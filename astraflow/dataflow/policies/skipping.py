"""Predictive skipping (GRESO-style): do not roll out prompts that will likely give a
zero-variance group again.

Why: with pass/fail rewards a prompt the policy always solves (or never solves) yields a group with
no advantage signal: its rollouts cost generation time and teach nothing, and DAPO's filter drops
them only after they were generated. A prompt's recent groups predict its next one well (GRESO,
Zheng et al. 2025), so such a prompt is skipped before rollout, with a probability that decays with
each skip so that it is retried: the policy changes, and a prompt it could not solve may become
learnable.
"""

from __future__ import annotations

import random
import re
from typing import Any

from astraflow.dataflow.policies.base import (
    GroupObserver,
    GroupView,
    PolicyConfigError,
    TaskGate,
    TaskView,
)

_EPOCH = re.compile(r":e\d+:")


def prompt_key(task_id: str) -> str:
    """The prompt a task id stands for, across epochs (``set:split:e3:id`` -> ``set:split:id``)."""
    return _EPOCH.sub(":", task_id, count=1)


class PredictiveSkip(TaskGate, GroupObserver):
    """Skip a prompt whose last ``min_streak`` groups were all zero-variance (all rewards equal,
    i.e. all correct or all wrong), with probability ``p_max * decay ** k`` where ``k`` is how often
    it was skipped since it last ran. Skips are counted as ``predicted_zero_variance`` (in
    rollouts: ``group_size`` per skipped task).

    The draw is seeded by (``seed``, prompt, streak, k): the same history gives the same decision,
    whatever the order in which the service meets the tasks and across restarts.
    """

    name = "predictive_skip"
    description = "skip prompts whose recent groups were all-correct or all-wrong (GRESO)"

    def __init__(
        self,
        p_max: float = 0.9,
        decay: float = 0.5,
        min_streak: int = 1,
        tolerance: float = 1e-6,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(p_max, (int, float)) or not 0.0 <= p_max <= 1.0:
            raise PolicyConfigError(f"predictive_skip: p_max must be in [0, 1], got {p_max!r}")
        if not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
            raise PolicyConfigError(
                f"predictive_skip: decay must be in [0, 1) so skipped prompts are retried, "
                f"got {decay!r}"
            )
        if not isinstance(min_streak, int) or min_streak < 1:
            raise PolicyConfigError(
                f"predictive_skip: min_streak must be an integer >= 1, got {min_streak!r}"
            )
        if not isinstance(tolerance, (int, float)) or tolerance < 0:
            raise PolicyConfigError(
                f"predictive_skip: tolerance must be a number >= 0, got {tolerance!r}"
            )
        self.p_max = float(p_max)
        self.decay = float(decay)
        self.min_streak = min_streak
        self.tolerance = float(tolerance)
        self.seed = int(seed)
        #: prompt -> [zero-variance streak, skips since it last ran]
        self.prompts: dict[str, list[int]] = {}
        self._changed: set[str] = set()

    def skip_probability(self, key: str) -> float:
        streak, skips = self.prompts.get(key, (0, 0))
        if streak < self.min_streak:
            return 0.0
        return self.p_max * self.decay**skips

    def skip_reason(self, task: TaskView, now: float) -> str | None:
        key = prompt_key(task.id)
        p = self.skip_probability(key)
        if p <= 0.0:
            return None
        streak, skips = self.prompts[key]
        if random.Random(f"{self.seed}:{key}:{streak}:{skips}").random() >= p:
            return None
        self.prompts[key] = [streak, skips + 1]
        self._changed.add(key)
        return "predicted_zero_variance"

    def observe(self, group: GroupView) -> None:
        if not group.rewards:
            return
        key = prompt_key(group.task_id)
        streak, _ = self.prompts.get(key, (0, 0))
        zero = max(group.rewards) - min(group.rewards) <= self.tolerance
        self.prompts[key] = [streak + 1 if zero else 0, 0]
        self._changed.add(key)

    def state_changes(self) -> dict[str, Any]:
        out = {k: self.prompts[k] for k in self._changed}
        self._changed.clear()
        return out

    def load_state(self, entries: dict[str, Any]) -> None:
        for key, value in entries.items():
            self.prompts[key] = [int(value[0]), int(value[1])]
