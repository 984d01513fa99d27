"""Pushed episodes (``episodes``): task, lease, node, finish reason, error, rewards and info of
every episode a node pushed; never deleted (so the largest rowid is their count)."""

from __future__ import annotations

from astraflow.dataflow.store import Tx


def existing(tx: Tx, episode_ids: list[str]) -> set[str]:
    """Which of ``episode_ids`` were pushed already: one query for a whole push (the store's
    single writer runs every statement of every push, so statements per push bound the rate)."""
    return {
        r[0] for r in tx.select_in("SELECT id FROM episodes WHERE id IN ({marks})", episode_ids)
    }


def insert_many(tx: Tx, rows: list[tuple]) -> None:
    """Rows of (id, task_id, lease_id, node_id, is_eval, finish_reason, error, rewards, info,
    created_at)."""
    tx.executemany(
        "INSERT INTO episodes(id, task_id, lease_id, node_id, is_eval, finish_reason, error, "
        "rewards, info, created_at) VALUES(?,?,?,?,?,?,?,?,?,?)",
        rows,
    )


def counts_by_node_since(tx: Tx, since: float) -> list[tuple[str, int]]:
    """(node_id, episodes pushed after ``since``)."""
    return tx.execute(
        "SELECT node_id, COUNT(*) FROM episodes WHERE created_at > ? GROUP BY node_id",
        (since,),
    ).fetchall()


def count(tx: Tx) -> int:
    """Episodes ever pushed: the largest rowid, as none is deleted (no table scan)."""
    return tx.scalar("SELECT MAX(rowid) FROM episodes", (), 0)
