"""Tasks (``tasks``): each task the feeder or an evaluation queued, ``pending`` -> ``leased`` ->
``done`` (with its winner: the lease that delivered the group, ``skipped:<reason>`` or
``rewound``)."""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.policies import TaskView
from astraflow.dataflow.storage.store import Tx


class TaskCandidate(NamedTuple):
    """A pending training task a lease may hand out (:func:`pending_training`)."""

    seq: int
    id: str
    body: bytes
    task_set: str
    priority: float
    deadline: float | None
    group_size: int

    def view(self) -> TaskView:
        """The task as selection policies see it."""
        return TaskView(self.id, self.task_set, self.seq, self.priority, self.deadline)


class EvalCandidate(NamedTuple):
    """A pending evaluation task (:func:`pending_evaluations`): leased to a node holding at
    least ``min_version`` of ``eval_policy``."""

    seq: int
    id: str
    body: bytes
    eval_policy: str
    min_version: int | None
    priority: float


class RoundProgress(NamedTuple):
    #: training tasks of the round
    total: int
    #: how many of them are not done yet (None when there are none)
    open: int | None


#: Columns of a lease candidate, in :class:`TaskCandidate`'s order.
CANDIDATE_COLUMNS = ", ".join(TaskCandidate._fields)


def insert(tx: Tx, rows: list[tuple]) -> None:
    """Insert task rows; an id already present is skipped (idempotent enqueue)."""
    tx.executemany(
        "INSERT OR IGNORE INTO tasks(id, body, task_set, priority, deadline, group_size, is_eval, "
        "eval_id, eval_policy, min_version, round, created_at) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )


def mark_leased(tx: Tx, task_id: str) -> None:
    tx.execute("UPDATE tasks SET state='leased' WHERE id=?", (task_id,))


def requeue(tx: Tx, task_id: str) -> None:
    """A leased task goes back to the queue (a done task stays done)."""
    tx.execute("UPDATE tasks SET state='pending' WHERE id=? AND state='leased'", (task_id,))


def finish(tx: Tx, task_id: str, winner: str, now: float) -> None:
    tx.execute(
        "UPDATE tasks SET state='done', winner=?, done_at=? WHERE id=?", (winner, now, task_id)
    )


def cancel_evaluation(tx: Tx, eval_id: str, now: float) -> None:
    """Close the evaluation's open tasks (its versions were rewound)."""
    tx.execute(
        "UPDATE tasks SET state='done', winner='rewound', done_at=? "
        "WHERE eval_id=? AND state != 'done'",
        (now, eval_id),
    )


def pending_evaluations(tx: Tx, limit: int) -> list[EvalCandidate]:
    """Pending evaluation tasks, highest priority first."""
    return tx.rows(
        EvalCandidate,
        "SELECT seq, id, body, eval_policy, min_version, priority FROM tasks "
        "WHERE state='pending' AND is_eval=1 ORDER BY priority DESC, seq LIMIT ?",
        (limit,),
    )


def pending_training_count(tx: Tx) -> int:
    return tx.scalar("SELECT COUNT(*) FROM tasks WHERE state='pending' AND is_eval=0", (), 0)


def pending_training(tx: Tx, limit: int) -> list[TaskCandidate]:
    """Pending training tasks, oldest first."""
    return tx.rows(
        TaskCandidate,
        f"SELECT {CANDIDATE_COLUMNS} FROM tasks WHERE state='pending' AND is_eval=0 "
        "ORDER BY seq LIMIT ?",
        (limit,),
    )


def pending_training_of_round(tx: Tx, round_: int) -> list[TaskCandidate]:
    """Lock-step round ``round_``'s pending tasks, oldest first."""
    return tx.rows(
        TaskCandidate,
        f"SELECT {CANDIDATE_COLUMNS} FROM tasks WHERE state='pending' AND is_eval=0 AND round=? "
        "ORDER BY seq",
        (round_,),
    )


def round_progress(tx: Tx, round_: int) -> RoundProgress:
    return tx.row(
        RoundProgress,
        "SELECT COUNT(*), SUM(state != 'done') FROM tasks WHERE is_eval=0 AND round=?",
        (round_,),
    )


def outstanding_training(tx: Tx) -> int:
    return tx.scalar("SELECT COUNT(*) FROM tasks WHERE is_eval=0 AND state != 'done'", (), 0)


def open_evaluations(tx: Tx) -> list[tuple[str, int | None, int]]:
    """(eval_policy, min_version, count) of evaluation tasks not done yet."""
    return tx.execute(
        "SELECT eval_policy, min_version, COUNT(*) FROM tasks WHERE is_eval=1 AND state != 'done' "
        "GROUP BY eval_policy, min_version"
    ).fetchall()


def pending_by_set(tx: Tx) -> list[tuple[str, int, int]]:
    """(task_set, is_eval, count) of pending tasks."""
    return tx.execute(
        "SELECT task_set, is_eval, COUNT(*) FROM tasks WHERE state='pending' "
        "GROUP BY task_set, is_eval"
    ).fetchall()


def done_training_count(tx: Tx) -> int:
    return tx.scalar("SELECT COUNT(*) FROM tasks WHERE state='done' AND is_eval=0", (), 0)
