"""Served batches (``batches``): a policy's groups and samples with their advantages (``layout``)
and ``summary``, ``served`` -> ``acked`` (with its ``step``) | ``skipped`` | ``rewound``."""

from __future__ import annotations

from astraflow.dataflow.store import Tx


def oldest_served(tx: Tx, policy: str) -> tuple[str] | None:
    """(id,) of ``policy``'s oldest served, unacknowledged batch."""
    return tx.one(
        "SELECT id FROM batches WHERE policy=? AND state='served' ORDER BY seq LIMIT 1",
        (policy,),
    )


def count_redelivery(tx: Tx, batch_id: str) -> None:
    tx.execute("UPDATE batches SET served = served + 1 WHERE id=?", (batch_id,))


def round_acked(tx: Tx, policy: str, round_: int) -> tuple | None:
    """A row when ``policy`` acknowledged its batch of lock-step round ``round_``."""
    return tx.one(
        "SELECT 1 FROM batches WHERE policy=? AND round=? AND state='acked'", (policy, round_)
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


def for_ack(tx: Tx, batch_id: str) -> tuple[str, str, str, int | None] | None:
    """(policy, state, summary, round) of a batch, or None for an unknown one."""
    return tx.one("SELECT policy, state, summary, round FROM batches WHERE id=?", (batch_id,))


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
    """Undo a step: the batch becomes ``served`` again (or ``rewound``), without its step."""
    tx.execute(
        "UPDATE batches SET state=?, acked_at=NULL, step=NULL WHERE id=?",
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
