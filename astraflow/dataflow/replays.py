"""Replay storage: a replayed group is a new group whose samples are new rows copying the
originals (tokens, log-probs, versions, rewards) and referencing them in the ``replays`` table.

Why copies and not a second use of the same rows: the exact-resume invariants
(:mod:`astraflow.dataflow.timeline`) say no sample is in two acknowledged batches and a sample's
arrays are freed once a checkpoint covers its step. A copy made when the original is batched is
its own sample: it is in at most one acknowledged batch and freed by the same rules, and the
original can be freed on schedule. Pool copies wait in state ``replay_pool`` (not ``ready``, so
they neither count as buffered work nor hold back leasing) until the replay policy picks them or
they grow too stale (then they are dropped and freed).
"""

from __future__ import annotations

from astraflow.dataflow import storage
from astraflow.dataflow.context import Context
from astraflow.dataflow.policies import GroupView
from astraflow.dataflow.store import Tx

POOL = "replay_pool"


def pool_candidates(ctx: Context, tx: Tx, policy: str, trainer_version: int, n: int) -> list:
    """Pick up to ``n`` pooled groups of ``policy`` (as ``_ready_groups`` rows); expire the
    ones past the replay staleness bound."""
    replay = ctx.pipeline.replay
    if replay is None or n <= 0:
        return []
    rows = storage.groups.in_state(tx, policy, POOL)
    if not rows:
        return []
    by_id = {r[1]: r for r in rows}
    views = [
        GroupView(
            r[1],
            r[2],
            policy,
            r[3],
            storage.samples.rewards_of_group(tx, r[1]),
            r[0],
            r[6],
            r[4],
            r[5],
        )
        for r in rows
    ]
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
        row = storage.replays.lineage(tx, gid)
        origin, times = (row[0], row[1]) if row else (gid, 0)
        g = storage.groups.for_replay(tx, gid)
        view = GroupView(
            gid,
            g[1],
            policy,
            g[2],
            storage.samples.rewards_of_group(tx, gid),
            g[0],
            g[3],
            g[4],
            g[5],
        )
        if not replay.admits(view, times):
            continue
        copy_id = f"{origin}#r{times + 1}"
        if storage.groups.exists(tx, copy_id):
            continue  # already made (a batch served again after a rewind)
        suffix = f"#r{times + 1}"
        storage.samples.copy_group(tx, suffix, copy_id, gid)
        storage.groups.insert(
            tx, (copy_id, g[1], policy, g[2], g[6], g[7], g[8], g[9], g[3], g[4], g[5], POOL, now)
        )
        storage.replays.insert(tx, copy_id, gid, origin, times + 1, now)
        admitted += 1
    return admitted


def is_replay(group_id: str) -> bool:
    return "#r" in group_id
