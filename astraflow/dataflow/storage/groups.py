"""Groups (``groups``): the samples of one task for one policy, with their reward statistics;
``ready`` (in the buffer) -> ``batched`` (with ``batch_id``), or ``filtered`` / ``dropped``;
replay copies wait as ``replay_pool``."""

from __future__ import annotations

import sqlite3
from typing import NamedTuple

from astraflow.dataflow.policies import GroupView
from astraflow.dataflow.storage.store import Tx


class NewGroup(NamedTuple):
    """A group row to insert (:func:`insert`)."""

    id: str
    task_id: str
    policy: str
    task_set: str
    round: int | None
    size: int
    reward_mean: float
    reward_std: float
    min_version: int
    priority: float
    deadline: float | None
    state: str
    created_at: float


class GroupRow(NamedTuple):
    """A batch candidate: a ready (or pooled) group with its reward statistics."""

    seq: int
    id: str
    task_id: str
    task_set: str
    priority: float
    deadline: float | None
    min_version: int
    reward_mean: float
    reward_std: float

    def view(self, policy: str, rewards: list[float] | None = None) -> GroupView:
        """The group as ordering and replay policies see it (``rewards``: its samples' rewards,
        for the policies that read them)."""
        return GroupView(
            self.id,
            self.task_id,
            policy,
            self.task_set,
            [] if rewards is None else rewards,
            self.seq,
            self.min_version,
            self.priority,
            self.deadline,
        )


class ReplaySource(NamedTuple):
    """A batched group as the replay pool copies it (:func:`for_replay`)."""

    seq: int
    task_id: str
    task_set: str
    min_version: int
    priority: float
    deadline: float | None
    round: int | None
    size: int
    reward_mean: float
    reward_std: float

    def view(self, group_id: str, policy: str, rewards: list[float]) -> GroupView:
        return GroupView(
            group_id,
            self.task_id,
            policy,
            self.task_set,
            rewards,
            self.seq,
            self.min_version,
            self.priority,
            self.deadline,
        )


class GroupSummary(NamedTuple):
    """What an assembled batch says of each of its groups (:func:`for_assembly`)."""

    task_id: str
    task_set: str
    reward_mean: float
    reward_std: float


def insert(tx: Tx, row: NewGroup) -> None:
    tx.execute(
        "INSERT INTO groups(id, task_id, policy, task_set, round, size, reward_mean, "
        "reward_std, min_version, priority, deadline, state, created_at) "
        "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
        row,
    )


def ready(tx: Tx, policy: str, round_: int | None = None) -> list[GroupRow]:
    """Batch candidates: ``policy``'s ready groups (of lock-step round ``round_``)."""
    sql = (
        "SELECT seq, id, task_id, task_set, priority, deadline, min_version, reward_mean, "
        "reward_std FROM groups WHERE policy=? AND state='ready'"
    )
    params: tuple = (policy,)
    if round_ is not None:
        sql += " AND round=?"
        params = (policy, round_)
    return tx.rows(GroupRow, sql, params)


class FilteredRewards(NamedTuple):
    """Groups of one policy that a group filter dropped, with one reward mean."""

    policy: str
    reward: float  # rounded to 3 places
    groups: int


def filtered_rewards(tx: Tx) -> list[FilteredRewards]:
    """The groups a group filter dropped, by policy and (rounded) reward mean."""
    return tx.rows(
        FilteredRewards,
        "SELECT policy, ROUND(reward_mean, 3), COUNT(*) FROM groups WHERE state='filtered' "
        "GROUP BY policy, ROUND(reward_mean, 3)",
    )


def in_state(tx: Tx, policy: str, state: str) -> list[GroupRow]:
    """Batch candidates (as :func:`ready`) among ``policy``'s groups in ``state``."""
    return tx.rows(
        GroupRow,
        "SELECT seq, id, task_id, task_set, priority, deadline, min_version, reward_mean, "
        "reward_std FROM groups WHERE policy=? AND state=?",
        (policy, state),
    )


def for_replay(tx: Tx, group_id: str) -> ReplaySource:
    return tx.row(
        ReplaySource,
        "SELECT seq, task_id, task_set, min_version, priority, deadline, round, size, "
        "reward_mean, reward_std FROM groups WHERE id=?",
        (group_id,),
    )


def exists(tx: Tx, group_id: str) -> tuple | None:
    return tx.one("SELECT 1 FROM groups WHERE id=?", (group_id,))


def for_assembly(tx: Tx, group_ids: list[str]) -> dict[str, GroupSummary]:
    """Group id -> its summary, for a whole batch at once."""
    rows = tx.select_in(
        "SELECT id, task_id, task_set, reward_mean, reward_std FROM groups WHERE id IN ({marks})",
        group_ids,
    )
    return {gid: GroupSummary(*rest) for gid, *rest in rows}


def mark_dropped(tx: Tx, group_id: str) -> None:
    tx.execute("UPDATE groups SET state='dropped' WHERE id=?", (group_id,))


def mark_all_dropped(tx: Tx, group_ids: list[str]) -> None:
    tx.executemany("UPDATE groups SET state='dropped' WHERE id=?", [(i,) for i in group_ids])


def mark_batched(tx: Tx, rows: list[tuple[str, str]]) -> None:
    """(batch_id, group_id) rows: each group is now in that batch."""
    tx.executemany("UPDATE groups SET state='batched', batch_id=? WHERE id=?", rows)


def ids_of_batch(tx: Tx, batch_id: str) -> list[str]:
    return [r[0] for r in tx.execute("SELECT id FROM groups WHERE batch_id=?", (batch_id,))]


def of_acked_steps(tx: Tx, policy: str, after: int, through: int) -> list[str]:
    """Ids of the groups in ``policy``'s batches acknowledged as steps ``after`` < step <=
    ``through``."""
    return [
        r[0]
        for r in tx.execute(
            "SELECT g.id FROM groups g JOIN batches b ON g.batch_id = b.id "
            "WHERE b.policy=? AND b.state='acked' AND b.step > ? AND b.step <= ?",
            (policy, after, through),
        )
    ]


def ready_counts(tx: Tx) -> dict[str, int]:
    """Policy -> its ready groups."""
    return dict(
        tx.execute("SELECT policy, COUNT(*) FROM groups WHERE state='ready' GROUP BY policy")
    )


def buffered(tx: Tx) -> sqlite3.Cursor:
    """(policy, ready groups, their samples) rows (iterate it)."""
    return tx.execute(
        "SELECT policy, COUNT(*), SUM(size) FROM groups WHERE state='ready' GROUP BY policy"
    )
