"""The feeder's cursor per task set (``feeder``): epoch, position in the epoch's order, tasks
emitted; saved in the transaction that enqueued the tasks, so a restart continues exactly."""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx


class Cursor(NamedTuple):
    """Where the feeder stands in one task set."""

    epoch: int
    #: position in the epoch's order
    position: int
    #: tasks emitted from the set so far, all epochs
    emitted: int


def cursors(tx: Tx) -> dict[str, Cursor]:
    """Task set -> its cursor, for every task set drawn from so far."""
    return {
        name: Cursor(epoch, pos, emitted)
        for name, epoch, pos, emitted in tx.execute(
            "SELECT task_set, epoch, position, emitted FROM feeder"
        )
    }


def save(tx: Tx, cursors: dict[str, Cursor]) -> None:
    """Store each task set's cursor."""
    tx.executemany(
        "INSERT INTO feeder(task_set, epoch, position, emitted) VALUES(?,?,?,?) "
        "ON CONFLICT(task_set) DO UPDATE SET epoch=excluded.epoch, "
        "position=excluded.position, emitted=excluded.emitted",
        [(k, *v) for k, v in cursors.items()],
    )
