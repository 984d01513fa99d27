"""Replay copies (``replays``): per replayed group, the group it was copied from (``source``),
the first original (``origin``) and how many times that original was replayed (``n``)."""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx


class Lineage(NamedTuple):
    #: the first original the copy descends from
    origin: str
    #: how many times that original was replayed
    n: int


def lineage(tx: Tx, group_id: str) -> Lineage | None:
    """None for a group that is not a replay copy."""
    return tx.row(Lineage, "SELECT origin, n FROM replays WHERE group_id=?", (group_id,))


def insert(tx: Tx, group_id: str, source: str, origin: str, n: int, now: float) -> None:
    tx.execute(
        "INSERT INTO replays(group_id, source, origin, n, created_at) VALUES(?,?,?,?,?)",
        (group_id, source, origin, n, now),
    )
