"""Episodes saved in flight (``partials``): one row per (task, episode index), the newest save of
that episode by whichever lease of the task played it, kept until the task completes.

Why per task and not per lease: the point of a saved episode is to outlive its lease. When the
lease expires, the task's next lease reads the rows of its task and the node that holds it resumes
them; its own saves then replace them row by row.
"""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx
from astraflow.protocol.codec import MSGPACK, decode, encode
from astraflow.protocol.models import PartialEpisode


class PartialRow(NamedTuple):
    """A saved episode as tools read it (``history.partials``)."""

    task_id: str
    index: int
    lease_id: str
    node_id: str
    turns: int
    saved_at: float
    partial: PartialEpisode


def save(
    tx: Tx, task_id: str, lease_id: str, node_id: str, partials: list[PartialEpisode], now: float
) -> None:
    """Store (or replace) each episode's saved state."""
    tx.executemany(
        "INSERT OR REPLACE INTO partials(task_id, idx, lease_id, node_id, turns, saved_at, body) "
        "VALUES(?,?,?,?,?,?,?)",
        [(task_id, p.index, lease_id, node_id, p.turns, now, encode(p)) for p in partials],
    )


def of_task(tx: Tx, task_id: str) -> list[PartialEpisode]:
    """The task's saved episodes, by episode index."""
    return [
        decode(PartialEpisode, body, MSGPACK)
        for (body,) in tx.execute(
            "SELECT body FROM partials WHERE task_id = ? ORDER BY idx", (task_id,)
        )
    ]


def count_of_task(tx: Tx, task_id: str) -> int:
    return int(tx.scalar("SELECT COUNT(*) FROM partials WHERE task_id = ?", (task_id,), 0))


def delete_of_task(tx: Tx, task_id: str) -> None:
    tx.execute("DELETE FROM partials WHERE task_id = ?", (task_id,))


def count(tx: Tx) -> int:
    """Saved episodes of tasks not done yet (``/status``'s ``saved_episodes``)."""
    return int(tx.scalar("SELECT COUNT(*) FROM partials", default=0))


def all_rows(tx: Tx) -> list[PartialRow]:
    """Every saved episode (tools and tests, through ``history.partials``)."""
    return [
        PartialRow(t, i, lid, n, turns, at, decode(PartialEpisode, body, MSGPACK))
        for t, i, lid, n, turns, at, body in tx.execute(
            "SELECT task_id, idx, lease_id, node_id, turns, saved_at, body FROM partials "
            "ORDER BY task_id, idx"
        )
    ]
