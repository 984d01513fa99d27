"""Replay copies (``replays``): per replayed group, the group it was copied from (``source``),
the first original (``origin``) and how many times that original was replayed (``n``)."""

from __future__ import annotations

from astraflow.dataflow.store import Tx


def lineage(tx: Tx, group_id: str) -> tuple[str, int] | None:
    """(origin, n) of a replay copy, or None for a group that is not one."""
    return tx.one("SELECT origin, n FROM replays WHERE group_id=?", (group_id,))


def insert(tx: Tx, group_id: str, source: str, origin: str, n: int, now: float) -> None:
    tx.execute(
        "INSERT INTO replays(group_id, source, origin, n, created_at) VALUES(?,?,?,?,?)",
        (group_id, source, origin, n, now),
    )
