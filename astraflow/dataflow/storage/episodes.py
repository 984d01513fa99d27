"""Pushed episodes (``episodes``): task, lease, node, finish reason, error, rewards and info of
every episode a node pushed; never deleted (so the largest rowid is their count)."""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx


class EpisodeOutcome(NamedTuple):
    """What a training episode left: the node's ``info`` and the ``rewards`` by role (JSON)."""

    info: str
    rewards: str


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


class FailedEpisodes(NamedTuple):
    """The episodes of one finish reason that carry an error."""

    finish_reason: str
    count: int
    first_error: str
    last_error: str


def errors_by_reason(tx: Tx) -> list[FailedEpisodes]:
    """Failed episodes by finish reason with the first and newest error; a partial index keeps
    this off the table's successful rows."""
    rows = tx.execute(
        "SELECT finish_reason, COUNT(*), MIN(rowid), MAX(rowid) FROM episodes "
        "WHERE error IS NOT NULL GROUP BY finish_reason"
    ).fetchall()
    out = []
    for reason, n, first, last in rows:
        texts = dict(
            tx.execute(
                "SELECT rowid, error FROM episodes WHERE rowid IN (?, ?)", (first, last)
            ).fetchall()
        )
        out.append(FailedEpisodes(reason, n, texts.get(first, ""), texts.get(last, "")))
    return out


def count(tx: Tx) -> int:
    """Episodes ever pushed: the largest rowid, as none is deleted (no table scan)."""
    return tx.scalar("SELECT MAX(rowid) FROM episodes", (), 0)


def training_outcomes(tx: Tx) -> list[EpisodeOutcome]:
    """Every training episode's info and rewards (a whole-table read: after a run, not in one)."""
    return tx.rows(EpisodeOutcome, "SELECT info, rewards FROM episodes WHERE is_eval = 0")
