"""Held-out evaluations (``evaluations``): one row per requested evaluation with its progress."""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx


class EvalProgress(NamedTuple):
    completed: int
    num_tasks: int
    finished_at: float | None


#: Columns of an evaluation row, in this order (what :func:`get` and :func:`list_rows` return).
COLUMNS = (
    "id, policy, version, step, task_set, split, num_tasks, completed, errors, reward_sum, "
    "created_at, finished_at"
)


def insert(
    tx: Tx,
    eval_id: str,
    policy: str,
    version: int,
    step: int,
    task_set: str,
    split: str,
    num_tasks: int,
    now: float,
) -> None:
    tx.execute(
        "INSERT INTO evaluations(id, policy, version, step, task_set, split, num_tasks, "
        "created_at) VALUES(?,?,?,?,?,?,?,?)",
        (eval_id, policy, version, step, task_set, split, num_tasks, now),
    )


def add_episode(tx: Tx, eval_id: str, error: int, reward: float) -> None:
    tx.execute(
        "UPDATE evaluations SET completed = completed + 1, errors = errors + ?, "
        "reward_sum = reward_sum + ? WHERE id=?",
        (error, reward, eval_id),
    )


def progress(tx: Tx, eval_id: str) -> EvalProgress | None:
    return tx.row(
        EvalProgress,
        "SELECT completed, num_tasks, finished_at FROM evaluations WHERE id=?",
        (eval_id,),
    )


def mark_finished(tx: Tx, eval_id: str, now: float) -> None:
    tx.execute("UPDATE evaluations SET finished_at=? WHERE id=?", (now, eval_id))


def get(tx: Tx, eval_id: str) -> tuple | None:
    return tx.one(f"SELECT {COLUMNS} FROM evaluations WHERE id=?", (eval_id,))


def list_rows(tx: Tx, policy: str | None = None) -> list[tuple]:
    """Every evaluation (of ``policy``), oldest first."""
    if policy:
        return tx.execute(
            f"SELECT {COLUMNS} FROM evaluations WHERE policy=? ORDER BY created_at", (policy,)
        ).fetchall()
    return tx.execute(f"SELECT {COLUMNS} FROM evaluations ORDER BY created_at").fetchall()


def ids_after(tx: Tx, policy: str, version: int) -> list[str]:
    """Evaluations of ``policy`` at versions after ``version``."""
    return [
        r[0]
        for r in tx.execute(
            "SELECT id FROM evaluations WHERE policy=? AND version > ?", (policy, version)
        )
    ]


def delete(tx: Tx, eval_id: str) -> None:
    tx.execute("DELETE FROM evaluations WHERE id=?", (eval_id,))
