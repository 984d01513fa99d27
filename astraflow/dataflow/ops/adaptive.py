"""The service side of adaptive selection policies: their durable state and task skipping.

Policies that learn from completed groups (curriculum, predictive skipping) keep their state in
memory for speed; every change is written to the ``policy_state`` table in the same transaction as
the event that caused it, and read back at startup, so a restarted dataflow service continues with
the same pass rates and skip histories instead of relearning them.
"""

from __future__ import annotations

import json

from astraflow.dataflow import storage
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.policies import GroupView
from astraflow.dataflow.storage.store import Tx
from astraflow.dataflow.storage.tasks import TaskCandidate


def load(ctx: Context, tx: Tx) -> None:
    """Restore every observer's state from the store (service startup)."""
    pipe = ctx.pipeline
    for obs in pipe.observers:
        key = pipe.observer_key(obs)
        rows = storage.policy_state.of_policy(tx, key)
        if rows:
            obs.load_state({k: json.loads(v) for k, v in rows})


def persist(ctx: Context, tx: Tx) -> None:
    """Write the observers' changed entries (inside the caller's transaction)."""
    pipe = ctx.pipeline
    for obs in pipe.observers:
        changes = obs.state_changes()
        if changes:
            key = pipe.observer_key(obs)
            storage.policy_state.save(tx, [(key, k, json.dumps(v)) for k, v in changes.items()])


def observe(ctx: Context, tx: Tx, group: GroupView) -> None:
    """A training group completed: let the observers learn from it, durably."""
    if ctx.pipeline.observers:
        ctx.pipeline.observe(group)
        persist(ctx, tx)


def skip_pending(
    ctx: Context, tx: Tx, rows: list[TaskCandidate], want: int
) -> tuple[list[TaskCandidate], int]:
    """The first ``want`` candidates that no gate skips, and how many were skipped. Skipped
    tasks are closed without a rollout (``winner`` names the reason) and counted as
    ``group_size`` dropped rollouts per trainable policy."""
    if not ctx.pipeline.gates:
        return rows[:want], 0
    now = ctx.now()
    kept: list[TaskCandidate] = []
    skipped = 0
    for row in rows:
        if len(kept) >= want:
            break
        reason = ctx.pipeline.skip_reason(row.view(), now)
        if reason is None:
            kept.append(row)
            continue
        skipped += 1
        storage.tasks.finish(tx, row.id, f"skipped:{reason}", now)
        for policy in ctx.config.workflow_policies:
            if ctx.config.is_trainable(policy):
                storage.tallies.drops.add(tx, policy, reason, row.group_size)
    persist(ctx, tx)
    return kept, skipped
