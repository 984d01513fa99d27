"""Stored replies of requests that carry an idempotency key, so a retry gets the first answer.

Keys are scoped: the stored key is ``kind/caller/key`` (:func:`scoped`), so a node's push key
can never meet a lease key, a trainer's evaluation key or another node's key. A request whose
key was seen with a different body (its ``digest``) is a 409 naming the key, never a silent
duplicate.
"""

from __future__ import annotations

import hashlib

from astraflow.dataflow.errors import Conflict
from astraflow.dataflow.storage.store import Tx

#: Idempotency keys are kept this long (retries happen within minutes).
IDEMPOTENCY_TTL_S = 24 * 3600.0
#: Most keys one pruning transaction forgets.
PRUNE_CHUNK = 5_000


def scoped(kind: str, caller: str, key: str | None) -> str | None:
    """The stored form of ``key``: its route kind and caller first."""
    return f"{kind}/{caller}/{key}" if key else None


def digest(*parts: bytes | str) -> str:
    """The body digest a retry must match (sha256 over ``parts``)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else bytes(part)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def remembered(tx: Tx, key: str | None, kind: str, body_digest: str = "") -> bytes | None:
    """The stored reply of an earlier request with this (scoped) key, if any; 409 when that
    request had another body (``body_digest`` given and different)."""
    if not key:
        return None
    row = tx.one("SELECT result, digest FROM idempotency WHERE key=?", (key,))
    if row is None:
        return None
    if body_digest and row[1] and row[1] != body_digest:
        shown = key.split("/", 2)[-1]
        raise Conflict(
            f"idempotency key {shown!r} was already used for a {kind} with a different body; "
            "a retry must resend the same body, new work needs a new key",
            "idempotency_key",
        )
    return row[0]


def remembered_many(tx: Tx, keys: list[str]) -> dict[str, bytes]:
    """:func:`remembered` for many keys in a few statements (a lease pass over parked requests)."""
    return dict(tx.select_in("SELECT key, result FROM idempotency WHERE key IN ({marks})", keys))


def remember(
    tx: Tx, key: str | None, kind: str, result: bytes, now: float, body_digest: str = ""
) -> None:
    if key:
        tx.execute(
            "INSERT OR REPLACE INTO idempotency(key, kind, result, created_at, digest) "
            "VALUES(?,?,?,?,?)",
            (key, kind, result, now, body_digest),
        )


def forget(tx: Tx, key: str | None) -> None:
    """Forget the stored reply of ``key`` (a grant given back): a retry is answered afresh."""
    if key:
        tx.execute("DELETE FROM idempotency WHERE key=?", (key,))


def forget_evaluation(tx: Tx, result: bytes) -> None:
    """Forget the evaluation request whose stored reply is ``result``, so asking again queues a
    new evaluation."""
    tx.execute("DELETE FROM idempotency WHERE kind='evaluation' AND result=?", (result,))


def prune(tx: Tx, now: float, limit: int = PRUNE_CHUNK) -> int:
    """Forget at most ``limit`` keys older than :data:`IDEMPOTENCY_TTL_S`, oldest first; returns
    how many. Bounded so that one transaction on the single writer never holds the other
    requests back for long (a busy run keeps millions of keys a day): call again while it
    returns ``limit``."""
    return tx.execute(
        "DELETE FROM idempotency WHERE key IN (SELECT key FROM idempotency WHERE created_at < ? "
        "ORDER BY created_at LIMIT ?)",
        (now - IDEMPOTENCY_TTL_S, limit),
    ).rowcount
