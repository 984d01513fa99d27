"""What the dataflow service derives from a recipe, computed once at startup."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from astraflow.recipe.schema import Recipe

#: Added to a task's priority for evaluation tasks so they always go first.
EVAL_PRIORITY = 1e9


@dataclass
class ServiceConfig:
    recipe: Recipe
    metrics_path: Path
    lease_timeout_s: float
    heartbeat_interval_s: float
    max_body_bytes: int
    #: Pending training tasks kept enqueued ahead of demand (lazy enqueue window).
    task_window: int
    #: After training is done, nodes are told to stop only after this long (and once no evaluation
    #: is outstanding), so that a final evaluation requested right after the last ack still runs.
    done_grace_s: float
    clock: Callable[[], float] = field(default=time.time)

    @classmethod
    def from_recipe(
        cls,
        recipe: Recipe,
        *,
        metrics_path: Path | None = None,
        task_window: int | None = None,
        done_grace_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> ServiceConfig:
        df = recipe.dataflow
        if task_window is None:
            per_step = max(p.trainer.groups_per_step for p in recipe.policies.values())
            task_window = max(64, 4 * per_step)
        return cls(
            recipe=recipe,
            metrics_path=metrics_path or (recipe.run.run_dir / "metrics.jsonl"),
            lease_timeout_s=df.lease_timeout_s,
            heartbeat_interval_s=df.heartbeat_interval_s,
            max_body_bytes=int(df.max_body_mb * 1024 * 1024),
            task_window=task_window,
            done_grace_s=2 * df.heartbeat_interval_s if done_grace_s is None else done_grace_s,
            clock=clock,
        )

    # -- convenience views of the recipe -------------------------------------------------------
    @property
    def roles(self) -> dict[str, str]:
        return dict(self.recipe.workflow.roles)

    @property
    def workflow_policies(self) -> list[str]:
        """Policies that play a role, in role order, each once."""
        return list(dict.fromkeys(self.recipe.workflow.roles.values()))

    @property
    def trainable(self) -> list[str]:
        return [p for p in self.recipe.trainable_policies()]

    def is_trainable(self, policy: str) -> bool:
        p = self.recipe.policies.get(policy)
        return bool(p and p.trainable)

    @property
    def round_size(self) -> int:
        """Tasks per sync round: enough for one optimizer step of every trainable policy."""
        sizes = [self.recipe.policies[p].trainer.groups_per_step for p in self.trainable]
        return max(sizes) if sizes else 1
