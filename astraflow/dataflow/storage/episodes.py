"""Pushed episodes (``episodes``): task, lease, node, finish reason, error, rewards and info of
every episode a node pushed; never deleted (so the largest rowid is their count)."""

from __future__ import annotations

from astraflow.dataflow.store import Tx


def exists(tx: Tx, episode_id: str) -> tuple | None:
    return tx.one("SELECT 1 FROM episodes WHERE id=?", (episode_id,))


def insert(tx: Tx, row: tuple) -> None:
    """(id, task_id, lease_id, node_id, is_eval, finish_reason, error, rewards, info,
    created_at)."""
    tx.execute(
        "INSERT INTO episodes(id, task_id, lease_id, node_id, is_eval, finish_reason, error, "
        "rewards, info, created_at) VALUES(?,?,?,?,?,?,?,?,?,?)",
        row,
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
