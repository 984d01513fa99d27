"""Served batches (``batches``): a policy's groups and samples with their advantages (``layout``)
and ``summary``, ``served`` -> ``acked`` (with its ``step``) | ``skipped`` | ``rewound``."""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx


class AckTarget(NamedTuple):
    """A batch as its acknowledgement reads it (:func:`for_ack`)."""

    policy: str
    state: str
    summary: str
    round: int | None
    #: when the batch was first served (the trainer's step time runs from here to the ack)
    created_at: float


def oldest_served(tx: Tx, policy: str) -> str | None:
    """The id of ``policy``'s oldest served, unacknowledged batch."""
    return tx.scalar(
        "SELECT id FROM batches WHERE policy=? AND state='served' ORDER BY seq LIMIT 1",
        (policy,),
    )


def times_served(tx: Tx, batch_id: str) -> int:
    """How many times ``batch_id`` was served since it was last acknowledged (1 when first
    served, +1 per redelivery, 0 after a rewind undid its step)."""
    return int(tx.scalar("SELECT served FROM batches WHERE id=?", (batch_id,), 0))


def count_redelivery(tx: Tx, batch_id: str) -> None:
    tx.execute("UPDATE batches SET served = served + 1 WHERE id=?", (batch_id,))


def round_acked(tx: Tx, policy: str, round_: int) -> bool:
    """``policy`` acknowledged its batch of lock-step round ``round_``."""
    return (
        tx.one(
            "SELECT 1 FROM batches WHERE policy=? AND round=? AND state='acked'", (policy, round_)
        )
        is not None
    )


def insert(tx: Tx, row: tuple) -> None:
    """(id, policy, trainer_id, trainer_version, round, layout, summary, created_at), served."""
    tx.execute(
        "INSERT INTO batches(id, policy, trainer_id, trainer_version, round, layout, summary, "
        "state, created_at) VALUES(?,?,?,?,?,?,?,'served',?)",
        row,
    )


def for_assembly(tx: Tx, batch_id: str) -> tuple[str, int, str, str]:
    """(policy, trainer_version, layout, summary) of a batch."""
    return tx.one(
        "SELECT policy, trainer_version, layout, summary FROM batches WHERE id=?", (batch_id,)
    )


def for_ack(tx: Tx, batch_id: str) -> AckTarget | None:
    """None for an unknown batch."""
    return tx.row(
        AckTarget,
        "SELECT policy, state, summary, round, created_at FROM batches WHERE id=?",
        (batch_id,),
    )


def mark_skipped(tx: Tx, batch_id: str, now: float) -> None:
    tx.execute("UPDATE batches SET state='skipped', acked_at=? WHERE id=?", (now, batch_id))


def mark_acked(tx: Tx, batch_id: str, now: float, step: int) -> None:
    tx.execute(
        "UPDATE batches SET state='acked', acked_at=?, step=? WHERE id=?",
        (now, step, batch_id),
    )


def acked_after(tx: Tx, policy: str, step: int) -> list[tuple[str, int, str]]:
    """(id, step, summary) of ``policy``'s batches acknowledged as steps after ``step``."""
    return tx.execute(
        "SELECT id, step, summary FROM batches WHERE policy=? AND state='acked' AND step > ? "
        "ORDER BY step",
        (policy, step),
    ).fetchall()


def unack(tx: Tx, batch_id: str, new_state: str) -> None:
    """Undo a step: the batch becomes ``served`` again (or ``rewound``), without its step. Its
    serve count starts again: the serves before were acknowledged, so none of them was a failure
    of the trainer on this batch (quarantine counts only failures)."""
    tx.execute(
        "UPDATE batches SET state=?, acked_at=NULL, step=NULL, served=0 WHERE id=?",
        (new_state, batch_id),
    )


def steps(tx: Tx) -> dict[str, int]:
    """Acknowledged steps per policy."""
    rows = tx.execute(
        "SELECT policy, COUNT(*) FROM batches WHERE state='acked' GROUP BY policy"
    ).fetchall()
    return {p: n for p, n in rows}


def unacked_counts(tx: Tx) -> list[tuple[str, int]]:
    """(policy, served batches not acknowledged yet)."""
    return tx.execute(
        "SELECT policy, COUNT(*) FROM batches WHERE state='served' GROUP BY policy"
    ).fetchall()


def busy_since(tx: Tx, policy: str, since: float) -> list[tuple[float, float | None]]:
    """(served, acked or None) of ``policy``'s batches trained at any time after ``since``: the
    intervals its trainer was busy (a served batch is being trained until its ack)."""
    return tx.execute(
        "SELECT created_at, acked_at FROM batches WHERE policy=? AND state IN ('served','acked') "
        "AND (acked_at IS NULL OR acked_at > ?)",
        (policy, since),
    ).fetchall()


def first_served(tx: Tx, policy: str) -> float | None:
    """When ``policy``'s first batch was served (None before any)."""
    return tx.scalar("SELECT MIN(created_at) FROM batches WHERE policy=?", (policy,))
