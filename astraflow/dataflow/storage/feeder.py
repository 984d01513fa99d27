"""The feeder's cursor per task set (``feeder``): epoch, position in the epoch's order, tasks
emitted; saved in the transaction that enqueued the tasks, so a restart continues exactly."""

from __future__ import annotations

from astraflow.dataflow.store import Tx


def cursors(tx: Tx) -> list[tuple[str, int, int, int]]:
    """(task_set, epoch, position, emitted) of every task set drawn from so far."""
    return tx.execute("SELECT task_set, epoch, position, emitted FROM feeder").fetchall()


def save(tx: Tx, cursors: dict[str, list[int]]) -> None:
    """Store each task set's ``[epoch, position, emitted]``."""
    tx.executemany(
        "INSERT INTO feeder(task_set, epoch, position, emitted) VALUES(?,?,?,?) "
        "ON CONFLICT(task_set) DO UPDATE SET epoch=excluded.epoch, "
        "position=excluded.position, emitted=excluded.emitted",
        [(k, *v) for k, v in cursors.items()],
    )
