"""Task leases (``leases``): one row per task handed to a node, with its deadline and state
(``active`` -> ``finished`` | ``expired`` | ``released`` | ``superseded``)."""

from __future__ import annotations

import json
from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx


class LeaseRow(NamedTuple):
    node_id: str
    task_id: str
    state: str


class PushTarget(NamedTuple):
    """A lease and its task as a push reads them (:func:`for_push`)."""

    task_id: str
    node_id: str
    state: str
    #: episodes pushed on this lease so far
    episodes: int
    task_state: str
    winner: str | None
    group_size: int
    is_eval: int
    eval_id: str | None
    eval_policy: str | None
    round: int | None
    task_set: str
    priority: float
    deadline: float | None
    #: when the lease was granted (admission control measures group time from it)
    issued_at: float


class LeaseTaskState(NamedTuple):
    lease_state: str
    task_state: str
    winner: str | None


class OverdueLease(NamedTuple):
    id: str
    task_id: str
    node_id: str
    #: the lease's last progress: when it was issued, or its latest push or accepted save
    progress_at: float


#: When a lease last made progress (an SQL expression over the lease table named ``lease``): its grant, its latest push
#: (``episodes.created_at``, indexed by lease) or its latest save still kept (``partials``).
#: Computed, not stored, so no push or save writes the lease row for it.
def progress_at(lease: str = "leases") -> str:
    return (
        f"MAX({lease}.issued_at, "
        f"COALESCE((SELECT MAX(e.created_at) FROM episodes e WHERE e.lease_id = {lease}.id), 0), "
        f"COALESCE((SELECT MAX(p.saved_at) FROM partials p WHERE p.lease_id = {lease}.id), 0))"
    )


def insert(
    tx: Tx,
    lease_id: str,
    task_id: str,
    node_id: str,
    now: float,
    deadline: float,
    versions: dict[str, int],
    is_eval: bool,
) -> None:
    tx.execute(
        "INSERT INTO leases(id, task_id, node_id, issued_at, deadline, state, versions, is_eval) "
        "VALUES(?,?,?,?,?,'active',?,?)",
        (lease_id, task_id, node_id, now, deadline, json.dumps(versions), int(is_eval)),
    )


def get(tx: Tx, lease_id: str) -> LeaseRow | None:
    """None for an unknown lease."""
    return tx.row(LeaseRow, "SELECT node_id, task_id, state FROM leases WHERE id=?", (lease_id,))


def for_push(tx: Tx, lease_id: str) -> PushTarget | None:
    """None for an unknown lease. One statement: every push runs it on the writer."""
    return tx.row(
        PushTarget,
        "SELECT l.task_id, l.node_id, l.state, l.episodes, t.state, t.winner, t.group_size, "
        "t.is_eval, t.eval_id, t.eval_policy, t.round, t.task_set, t.priority, t.deadline, "
        "l.issued_at FROM leases l JOIN tasks t ON t.id = l.task_id WHERE l.id=?",
        (lease_id,),
    )


def with_task_state(tx: Tx, lease_id: str, node_id: str) -> LeaseTaskState | None:
    """A lease of ``node_id`` and its task's state."""
    return tx.row(
        LeaseTaskState,
        "SELECT l.state, t.state, t.winner FROM leases l JOIN tasks t ON t.id = l.task_id "
        "WHERE l.id=? AND l.node_id=?",
        (lease_id, node_id),
    )


def overdue(tx: Tx, now: float) -> list[OverdueLease]:
    """Active leases past their deadline."""
    return tx.rows(
        OverdueLease,
        f"SELECT l.id, l.task_id, l.node_id, {progress_at('l')} FROM leases l "
        "WHERE l.state='active' AND l.deadline < ?",
        (now,),
    )


def task_body(tx: Tx, lease_id: str) -> bytes | None:
    """The stored task (``tasks.body``) of a lease: what the service issued with it."""
    return tx.scalar(
        "SELECT t.body FROM leases l JOIN tasks t ON t.id = l.task_id WHERE l.id=?",
        (lease_id,),
        None,
    )


def expire(tx: Tx, lease_ids: list[str]) -> None:
    tx.executemany("UPDATE leases SET state='expired' WHERE id=?", [(i,) for i in lease_ids])


def active_count_of_task(tx: Tx, task_id: str) -> int:
    return tx.scalar(
        "SELECT COUNT(*) FROM leases WHERE task_id=? AND state='active'", (task_id,), 0
    )


def in_flight_training(tx: Tx) -> int:
    """Active leases of training (not evaluation) tasks."""
    return tx.scalar("SELECT COUNT(*) FROM leases WHERE state='active' AND is_eval=0", (), 0)


def active_of_node(tx: Tx, node_id: str) -> list[str]:
    return [
        r[0]
        for r in tx.execute(
            "SELECT id FROM leases WHERE node_id=? AND state='active'", (node_id,)
        ).fetchall()
    ]


def extend_node(tx: Tx, node_id: str, deadline: float, progress_s: float | None = None) -> None:
    """Move the deadline of every active lease of ``node_id`` to ``deadline``, but (with
    ``progress_s``) never past ``progress_s`` after the lease's last progress
    (:func:`progress_at`): heartbeats alone cannot keep a lease that does nothing."""
    if progress_s is None:
        tx.execute(
            "UPDATE leases SET deadline=? WHERE node_id=? AND state='active'",
            (deadline, node_id),
        )
        return
    tx.execute(
        f"UPDATE leases SET deadline = MAX(deadline, MIN(?, {progress_at()} + ?)) "
        "WHERE node_id=? AND state='active'",
        (deadline, progress_s, node_id),
    )


def active_training_of_node(tx: Tx, node_id: str) -> int:
    """Active training (not evaluation) leases held by ``node_id`` (the per-node quota)."""
    return tx.scalar(
        "SELECT COUNT(*) FROM leases WHERE node_id=? AND state='active' AND is_eval=0",
        (node_id,),
        0,
    )


def mark_released(tx: Tx, lease_id: str) -> None:
    tx.execute("UPDATE leases SET state='released' WHERE id=?", (lease_id,))


def mark_finished(tx: Tx, lease_id: str) -> None:
    tx.execute("UPDATE leases SET state='finished' WHERE id=?", (lease_id,))


def mark_superseded(tx: Tx, lease_id: str) -> None:
    tx.execute("UPDATE leases SET state='superseded' WHERE id=?", (lease_id,))


def add_episodes(tx: Tx, lease_id: str, n: int) -> None:
    tx.execute("UPDATE leases SET episodes = episodes + ? WHERE id=?", (n, lease_id))


def others_of_task(tx: Tx, task_id: str, lease_id: str) -> list[str]:
    """The task's other leases not superseded yet (the losers once ``lease_id`` won)."""
    return [
        r[0]
        for r in tx.execute(
            "SELECT id FROM leases WHERE task_id=? AND id != ? AND state != 'superseded'",
            (task_id, lease_id),
        ).fetchall()
    ]


def counts_by_state(tx: Tx) -> dict[str, int]:
    return dict(tx.execute("SELECT state, COUNT(*) FROM leases GROUP BY state").fetchall())


def active_by_node(tx: Tx) -> dict[str, int]:
    return dict(
        tx.execute(
            "SELECT node_id, COUNT(*) FROM leases WHERE state='active' GROUP BY node_id"
        ).fetchall()
    )
