"""Samples (``samples``): one policy's view of one episode, with its packed token arrays
(``tokens``, ``loss_mask``, ``logprobs``, ``versions``), in the group ``group_id`` from insertion
on; the arrays are emptied once no trainer can receive the sample again."""

from __future__ import annotations

from astraflow.dataflow.store import Tx


def insert(tx: Tx, rows: list[tuple]) -> None:
    """(id, episode_id, lease_id, task_id, policy, group_id, role, reward, min_version,
    max_version, n_tokens, tokens, loss_mask, logprobs, versions) rows."""
    tx.executemany(
        "INSERT INTO samples(id, episode_id, lease_id, task_id, policy, group_id, role, reward, "
        "min_version, max_version, n_tokens, tokens, loss_mask, logprobs, versions) "
        "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )


def of_lease(tx: Tx, lease_id: str) -> list[tuple[str, str, float, int]]:
    """(id, policy, reward, min_version) of a lease's samples, in insertion order."""
    return tx.execute(
        "SELECT id, policy, reward, min_version FROM samples WHERE lease_id=? ORDER BY rowid",
        (lease_id,),
    ).fetchall()


def counts_of_lease(tx: Tx, lease_id: str) -> list[tuple[str, int]]:
    """(policy, samples) of a lease."""
    return tx.execute(
        "SELECT policy, COUNT(*) FROM samples WHERE lease_id=? GROUP BY policy", (lease_id,)
    ).fetchall()


def delete_of_lease(tx: Tx, lease_id: str) -> None:
    tx.execute("DELETE FROM samples WHERE lease_id=?", (lease_id,))


def of_group(tx: Tx, group_id: str) -> list[tuple[str, float, int]]:
    """(id, reward, min_version) of a group's samples, in insertion order."""
    return tx.execute(
        "SELECT id, reward, min_version FROM samples WHERE group_id=? ORDER BY rowid", (group_id,)
    ).fetchall()


def rewards_of_group(tx: Tx, group_id: str) -> list[float]:
    """A group's rewards, in insertion order."""
    return [
        r[0]
        for r in tx.execute(
            "SELECT reward FROM samples WHERE group_id=? ORDER BY rowid", (group_id,)
        ).fetchall()
    ]


def for_assembly(tx: Tx, sample_ids: list[str]) -> dict[str, tuple]:
    """Sample id -> (role, task_id, episode_id, tokens, loss_mask, logprobs, versions, reward),
    for a whole batch in a few statements."""
    rows = tx.select_in(
        "SELECT id, role, task_id, episode_id, tokens, loss_mask, logprobs, versions, reward "
        "FROM samples WHERE id IN ({marks})",
        sample_ids,
    )
    return {row[0]: row[1:] for row in rows}


def copy_group(tx: Tx, suffix: str, copy_id: str, group_id: str) -> None:
    """Copy a group's samples into group ``copy_id``: each copy's id is the original's id
    (without an earlier ``#r`` suffix) plus ``suffix``, its lease ``replay:<lease>``."""
    tx.execute(
        "INSERT INTO samples(id, episode_id, lease_id, task_id, policy, role, group_id, reward, "
        "min_version, max_version, n_tokens, tokens, loss_mask, logprobs, versions) "
        "SELECT substr(id, 1, CASE WHEN instr(id, '#r') > 0 THEN instr(id, '#r') - 1 "
        "ELSE length(id) END) || ?, episode_id, 'replay:' || lease_id, task_id, policy, role, "
        "?, reward, min_version, max_version, n_tokens, tokens, loss_mask, logprobs, versions "
        "FROM samples WHERE group_id=? ORDER BY rowid",
        (suffix, copy_id, group_id),
    )


def discard_token_arrays(tx: Tx, group_ids: list[str]) -> None:
    """Free the token arrays of samples no trainer will ever receive again (acked, filtered or
    dropped groups), so that the store stops growing with every episode of a long run. Ids,
    rewards and versions stay for the record."""
    tx.executemany(
        "UPDATE samples SET tokens=X'', loss_mask=X'', logprobs=X'', versions=X'' WHERE group_id=?",
        [(g,) for g in group_ids],
    )
