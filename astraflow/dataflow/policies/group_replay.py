"""Replay: re-serve high-advantage groups, within a staleness bound, as a share of each batch.

Why: a group with a large advantage spread carries a strong learning signal, and training on it
once more costs no rollout. Replayed data is off-policy; the bound keeps it close, and the trainer
corrects it with the behaviour log-probs the samples carry (as for any stale sample).

The policy decides only *which* groups enter the replay pool and *which* are replayed; the service
(:mod:`astraflow.dataflow.ops.replay_pool`) stores a replay as a new group whose samples are new
rows that reference the originals, so no sample row is ever in two acknowledged batches.
"""

from __future__ import annotations

import statistics
from typing import Any

from astraflow.dataflow.policies.base import DataflowPolicy, GroupView, PolicyConfigError


def advantage_score(rewards: list[float]) -> float:
    """Mean absolute (unscaled) advantage of a group: 0 for a zero-variance group."""
    if len(rewards) < 2:
        return 0.0
    mean = statistics.fmean(rewards)
    return statistics.fmean(abs(r - mean) for r in rewards)


class GroupReplay(DataflowPolicy):
    """Each batch of ``n`` groups holds ``round(ratio * n)`` replayed groups when the pool has
    them (fresh groups fill the rest). A batched group enters the pool when its advantage score
    (:func:`advantage_score`) is at least ``min_score``; it is replayed at most ``max_replays``
    times, best score first (then freshest), and leaves the pool once its oldest token is more than
    ``max_staleness`` versions behind the trainer (counted as ``replay_expired``)."""

    name = "replay"
    stage = "batching"
    description = "re-serve high-advantage groups within a staleness bound (replay ratio)"

    def __init__(
        self,
        ratio: float = 0.25,
        max_staleness: int = 2,
        min_score: float = 0.3,
        max_replays: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(ratio, (int, float)) or not 0.0 <= ratio < 1.0:
            raise PolicyConfigError(f"replay: ratio must be in [0, 1), got {ratio!r}")
        if not isinstance(max_staleness, int) or max_staleness < 0:
            raise PolicyConfigError(
                f"replay: max_staleness must be an integer >= 0, got {max_staleness!r}"
            )
        if not isinstance(min_score, (int, float)) or min_score < 0:
            raise PolicyConfigError(f"replay: min_score must be a number >= 0, got {min_score!r}")
        if not isinstance(max_replays, int) or max_replays < 1:
            raise PolicyConfigError(
                f"replay: max_replays must be an integer >= 1, got {max_replays!r}"
            )
        self.ratio = float(ratio)
        self.max_staleness = max_staleness
        self.min_score = float(min_score)
        self.max_replays = max_replays

    def slots(self, num_groups: int) -> int:
        """Replayed groups wanted in a batch of ``num_groups`` (at least one fresh group)."""
        return min(num_groups - 1, round(self.ratio * num_groups)) if num_groups > 1 else 0

    def admits(self, group: GroupView, times_replayed: int) -> bool:
        """Whether a group just batched (``times_replayed`` times a replay already) is pooled."""
        if times_replayed >= self.max_replays:
            return False
        score = advantage_score(group.rewards)
        return score > 0.0 and score >= self.min_score

    def expired(self, group: GroupView, trainer_version: int) -> bool:
        return group.min_version >= 0 and trainer_version - group.min_version > self.max_staleness

    def choose(
        self, pool: list[GroupView], trainer_version: int, n: int
    ) -> tuple[list[GroupView], list[GroupView]]:
        """(groups to replay now, best first; groups that expired)."""
        expired = [g for g in pool if self.expired(g, trainer_version)]
        live = [g for g in pool if not self.expired(g, trainer_version)]
        live.sort(key=lambda g: (-advantage_score(g.rewards), -g.min_version, g.seq))
        return live[:n], expired
