"""Groups (``groups``): the samples of one task for one policy, with their reward statistics;
``ready`` (in the buffer) -> ``batched`` (with ``batch_id``), or ``filtered`` / ``dropped``;
replay copies wait as ``replay_pool``."""

from __future__ import annotations

import sqlite3

from astraflow.dataflow.store import Tx


def insert(tx: Tx, row: tuple) -> None:
    """(id, task_id, policy, task_set, round, size, reward_mean, reward_std, min_version,
    priority, deadline, state, created_at)."""
    tx.execute(
        "INSERT INTO groups(id, task_id, policy, task_set, round, size, reward_mean, "
        "reward_std, min_version, priority, deadline, state, created_at) "
        "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)",
        row,
    )


def ready(tx: Tx, policy: str, round_: int | None = None) -> list[tuple]:
    """Batch candidates (seq, id, task_id, task_set, priority, deadline, min_version,
    reward_mean, reward_std): ``policy``'s ready groups (of lock-step round ``round_``)."""
    sql = (
        "SELECT seq, id, task_id, task_set, priority, deadline, min_version, reward_mean, "
        "reward_std FROM groups WHERE policy=? AND state='ready'"
    )
    params: tuple = (policy,)
    if round_ is not None:
        sql += " AND round=?"
        params = (policy, round_)
    return tx.execute(sql, params).fetchall()


def in_state(tx: Tx, policy: str, state: str) -> list[tuple]:
    """Batch candidates (as :func:`ready`) among ``policy``'s groups in ``state``."""
    return tx.execute(
        "SELECT seq, id, task_id, task_set, priority, deadline, min_version, reward_mean, "
        "reward_std FROM groups WHERE policy=? AND state=?",
        (policy, state),
    ).fetchall()


def for_replay(tx: Tx, group_id: str) -> tuple:
    """(seq, task_id, task_set, min_version, priority, deadline, round, size, reward_mean,
    reward_std) of a group."""
    return tx.one(
        "SELECT seq, task_id, task_set, min_version, priority, deadline, round, size, "
        "reward_mean, reward_std FROM groups WHERE id=?",
        (group_id,),
    )


def exists(tx: Tx, group_id: str) -> tuple | None:
    return tx.one("SELECT 1 FROM groups WHERE id=?", (group_id,))


def for_assembly(tx: Tx, group_ids: list[str]) -> dict[str, tuple[str, str, float, float]]:
    """Group id -> (task_id, task_set, reward_mean, reward_std), for a whole batch at once."""
    rows = tx.select_in(
        "SELECT id, task_id, task_set, reward_mean, reward_std FROM groups WHERE id IN ({marks})",
        group_ids,
    )
    return {row[0]: row[1:] for row in rows}


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


def ready_counts(tx: Tx) -> list[tuple[str, int]]:
    """(policy, ready groups)."""
    return tx.execute(
        "SELECT policy, COUNT(*) FROM groups WHERE state='ready' GROUP BY policy"
    ).fetchall()


def buffered(tx: Tx) -> sqlite3.Cursor:
    """(policy, ready groups, their samples) rows (iterate it)."""
    return tx.execute(
        "SELECT policy, COUNT(*), SUM(size) FROM groups WHERE state='ready' GROUP BY policy"
    )
