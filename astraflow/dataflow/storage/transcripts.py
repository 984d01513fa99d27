"""Sampled transcripts (``transcripts``): a few finished episodes per step, token arrays and all,
kept for people (`astraflow transcripts`, the dashboard); ``step`` is the weight version that
generated the episode, ``failed`` marks episodes that carry an error."""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx


class TranscriptCount(NamedTuple):
    step: int
    failed: int
    kept: int


class TranscriptRow(NamedTuple):
    seq: int
    episode_id: str
    task_id: str
    step: int
    failed: int
    created_at: float
    body: bytes


class GroupStats(NamedTuple):
    id: str
    reward_mean: float
    reward_std: float


def insert(tx: Tx, row: tuple) -> None:
    """(episode_id, task_id, step, failed, created_at, body)."""
    tx.execute(
        "INSERT INTO transcripts(episode_id, task_id, step, failed, created_at, body) "
        "VALUES(?,?,?,?,?,?)",
        row,
    )


def counts(tx: Tx) -> list[TranscriptCount]:
    """Transcripts kept per (step, failed): where the sampler resumes after a restart."""
    return tx.rows(
        TranscriptCount, "SELECT step, failed, COUNT(*) FROM transcripts GROUP BY step, failed"
    )


def select(
    tx: Tx, step: int | None = None, failed: bool | None = None, limit: int = 50
) -> list[TranscriptRow]:
    """The kept transcripts, newest step first."""
    sql = "SELECT seq, episode_id, task_id, step, failed, created_at, body FROM transcripts"
    where, params = [], []
    if step is not None:
        where.append("step=?")
        params.append(step)
    if failed is not None:
        where.append("failed=?")
        params.append(int(failed))
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY step DESC, seq LIMIT ?"
    params.append(limit)
    return tx.rows(TranscriptRow, sql, params)


def group_stats(tx: Tx, group_ids: list[str]) -> dict[str, GroupStats]:
    """The reward statistics of the groups the transcripts' episodes formed, by group id."""
    rows = tx.select_in(
        "SELECT id, reward_mean, reward_std FROM groups WHERE id IN ({marks})", group_ids
    )
    return {row.id: row for row in map(GroupStats._make, rows)}


class GroupFate(NamedTuple):
    id: str
    state: str
    batch_state: str | None
    step: int | None


def group_fates(tx: Tx, group_ids: list[str]) -> dict[str, GroupFate]:
    """Each group's state, and for a batched one its batch's state and step, by group id."""
    rows = tx.select_in(
        "SELECT g.id, g.state, b.state, b.step FROM groups g LEFT JOIN batches b "
        "ON b.id = g.batch_id WHERE g.id IN ({marks})",
        group_ids,
    )
    return {row.id: row for row in map(GroupFate._make, rows)}
