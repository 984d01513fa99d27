"""Replay storage: a replayed group is a new group whose samples are new rows copying the
originals (tokens, log-probs, versions, rewards) and referencing them in the ``replays`` table.

Why copies and not a second use of the same rows: the exact-resume invariants
(:mod:`astraflow.dataflow.ops.timeline`) say no sample is in two acknowledged batches and a sample's
arrays are freed once a checkpoint covers its step. A copy made when the original is batched is
its own sample: it is in at most one acknowledged batch and freed by the same rules, and the
original can be freed on schedule. Pool copies wait in state ``replay_pool`` (not ``ready``, so
they neither count as buffered work nor hold back leasing) until the replay policy picks them or
they grow too stale (then they are dropped and freed).
"""

from __future__ import annotations

from astraflow.dataflow import storage
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.storage.groups import GroupRow
from astraflow.dataflow.storage.store import Tx

POOL = "replay_pool"


def pool_candidates(
    ctx: Context, tx: Tx, policy: str, trainer_version: int, n: int
) -> list[GroupRow]:
    """Pick up to ``n`` pooled groups of ``policy`` (as ``_ready_groups`` rows); expire the
    ones past the replay staleness bound."""
    replay = ctx.pipeline.replay
    if replay is None or n <= 0:
        return []
    rows = storage.groups.in_state(tx, policy, POOL)
    if not rows:
        return []
    by_id = {g.id: g for g in rows}
    views = [g.view(policy, storage.samples.rewards_of_group(tx, g.id)) for g in rows]
    chosen, expired = replay.choose(views, trainer_version, n)
    if expired:
        ids = [g.id for g in expired]
        storage.groups.mark_all_dropped(tx, ids)
        storage.samples.discard_token_arrays(tx, ids)
        storage.tallies.counters.add(tx, policy, "replay_expired", len(ids))
    return [by_id[g.id] for g in chosen]


def admit(ctx: Context, tx: Tx, policy: str, group_ids: list[str]) -> int:
    """Copy the batched groups the replay policy admits into the pool; returns how many."""
    replay = ctx.pipeline.replay
    if replay is None:
        return 0
    now = ctx.now()
    admitted = 0
    for gid in group_ids:
        lineage = storage.replays.lineage(tx, gid)
        origin, times = (lineage.origin, lineage.n) if lineage else (gid, 0)
        g = storage.groups.for_replay(tx, gid)
        view = g.view(gid, policy, storage.samples.rewards_of_group(tx, gid))
        if not replay.admits(view, times):
            continue
        copy_id = f"{origin}#r{times + 1}"
        if storage.groups.exists(tx, copy_id):
            continue  # already made (a batch served again after a rewind)
        suffix = f"#r{times + 1}"
        storage.samples.copy_group(tx, suffix, copy_id, gid)
        storage.groups.insert(
            tx,
            storage.groups.NewGroup(
                id=copy_id,
                task_id=g.task_id,
                policy=policy,
                task_set=g.task_set,
                round=g.round,
                size=g.size,
                reward_mean=g.reward_mean,
                reward_std=g.reward_std,
                min_version=g.min_version,
                priority=g.priority,
                deadline=g.deadline,
                state=POOL,
                created_at=now,
            ),
        )
        storage.replays.insert(tx, copy_id, gid, origin, times + 1, now)
        admitted += 1
    return admitted


def is_replay(group_id: str) -> bool:
    return "#r" in group_id
