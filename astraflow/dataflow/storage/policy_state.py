"""Stateful dataflow policies' state (``policy_state``): one JSON value per (policy, key), e.g.
the curriculum's pass rates; written in the transaction that changed it, read at start-up."""

from __future__ import annotations

from astraflow.dataflow.storage.store import Tx


def of_policy(tx: Tx, policy: str) -> list[tuple[str, str]]:
    """(key, JSON value) of every entry stored for ``policy``."""
    return tx.execute("SELECT key, value FROM policy_state WHERE policy=?", (policy,)).fetchall()


def save(tx: Tx, rows: list[tuple[str, str, str]]) -> None:
    """Upsert (policy, key, JSON value) rows."""
    tx.executemany(
        "INSERT INTO policy_state(policy, key, value) VALUES(?,?,?) "
        "ON CONFLICT(policy, key) DO UPDATE SET value=excluded.value",
        rows,
    )
