"""Stored replies of requests that carry an idempotency key, so a retry gets the first answer."""

from __future__ import annotations

from astraflow.dataflow.store import Tx

#: Idempotency keys are kept this long (retries happen within minutes).
IDEMPOTENCY_TTL_S = 24 * 3600.0


def remembered(tx: Tx, key: str | None, kind: str) -> bytes | None:
    """The stored reply of an earlier request with this idempotency key, if any."""
    if not key:
        return None
    row = tx.one("SELECT kind, result FROM idempotency WHERE key=?", (key,))
    if row is None:
        return None
    return row[1]


def remembered_many(tx: Tx, keys: list[str]) -> dict[str, bytes]:
    """:func:`remembered` for many keys in a few statements (a lease pass over parked requests)."""
    return dict(tx.select_in("SELECT key, result FROM idempotency WHERE key IN ({marks})", keys))


def remember(tx: Tx, key: str | None, kind: str, result: bytes, now: float) -> None:
    if key:
        tx.execute(
            "INSERT OR REPLACE INTO idempotency(key, kind, result, created_at) VALUES(?,?,?,?)",
            (key, kind, result, now),
        )


def forget_evaluation(tx: Tx, result: bytes) -> None:
    """Forget the evaluation request whose stored reply is ``result``, so asking again queues a
    new evaluation."""
    tx.execute("DELETE FROM idempotency WHERE kind='evaluation' AND result=?", (result,))


def prune(tx: Tx, now: float) -> int:
    return tx.execute(
        "DELETE FROM idempotency WHERE created_at < ?", (now - IDEMPOTENCY_TTL_S,)
    ).rowcount
