"""Samples (``samples``): one policy's view of one episode, with its packed token arrays
(``tokens``, ``loss_mask``, ``logprobs``, ``versions``), in the group ``group_id`` from insertion
on; the arrays are emptied once no trainer can receive the sample again."""

from __future__ import annotations

from typing import NamedTuple

from astraflow.dataflow.policies import SampleView
from astraflow.dataflow.storage.store import Tx


class LeaseSample(NamedTuple):
    """A sample a lease pushed, as its group is formed (:func:`of_lease`)."""

    id: str
    policy: str
    reward: float
    min_version: int


class BatchSample(NamedTuple):
    """A sample as an assembled batch carries it (:func:`for_assembly`); arrays as stored."""

    role: str
    task_id: str
    episode_id: str
    tokens: bytes
    loss_mask: bytes
    logprobs: bytes
    versions: bytes
    reward: float
    #: the per-turn rewards as stored (a JSON list), or None
    turn_rewards: str | None


def insert(tx: Tx, rows: list[tuple]) -> None:
    """(id, episode_id, lease_id, task_id, policy, group_id, role, reward, min_version,
    max_version, n_tokens, tokens, loss_mask, logprobs, versions, turn_rewards) rows."""
    tx.executemany(
        "INSERT INTO samples(id, episode_id, lease_id, task_id, policy, group_id, role, reward, "
        "min_version, max_version, n_tokens, tokens, loss_mask, logprobs, versions, turn_rewards) "
        "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )


def of_lease(tx: Tx, lease_id: str) -> list[LeaseSample]:
    """A lease's samples, in insertion order."""
    return tx.rows(
        LeaseSample,
        "SELECT id, policy, reward, min_version FROM samples WHERE lease_id=? ORDER BY rowid",
        (lease_id,),
    )


def counts_of_lease(tx: Tx, lease_id: str) -> dict[str, int]:
    """Policy -> samples of a lease."""
    return dict(
        tx.execute(
            "SELECT policy, COUNT(*) FROM samples WHERE lease_id=? GROUP BY policy", (lease_id,)
        )
    )


def delete_of_lease(tx: Tx, lease_id: str) -> None:
    tx.execute("DELETE FROM samples WHERE lease_id=?", (lease_id,))


def views_of_group(tx: Tx, group_id: str) -> list[SampleView]:
    """A group's samples as batching policies see them, in insertion order."""
    return [
        SampleView(sid, group_id, reward, min_version)
        for sid, reward, min_version in tx.execute(
            "SELECT id, reward, min_version FROM samples WHERE group_id=? ORDER BY rowid",
            (group_id,),
        )
    ]


def rewards_of_group(tx: Tx, group_id: str) -> list[float]:
    """A group's rewards, in insertion order."""
    return [
        r[0]
        for r in tx.execute(
            "SELECT reward FROM samples WHERE group_id=? ORDER BY rowid", (group_id,)
        ).fetchall()
    ]


def for_assembly(tx: Tx, sample_ids: list[str]) -> dict[str, BatchSample]:
    """Sample id -> the sample, for a whole batch in a few statements."""
    rows = tx.select_in(
        "SELECT id, role, task_id, episode_id, tokens, loss_mask, logprobs, versions, reward, "
        "turn_rewards FROM samples WHERE id IN ({marks})",
        sample_ids,
    )
    return {sid: BatchSample(*rest) for sid, *rest in rows}


def copy_group(tx: Tx, suffix: str, copy_id: str, group_id: str) -> None:
    """Copy a group's samples into group ``copy_id``: each copy's id is the original's id
    (without an earlier ``#r`` suffix) plus ``suffix``, its lease ``replay:<lease>``."""
    tx.execute(
        "INSERT INTO samples(id, episode_id, lease_id, task_id, policy, role, group_id, reward, "
        "min_version, max_version, n_tokens, tokens, loss_mask, logprobs, versions, turn_rewards) "
        "SELECT substr(id, 1, CASE WHEN instr(id, '#r') > 0 THEN instr(id, '#r') - 1 "
        "ELSE length(id) END) || ?, episode_id, 'replay:' || lease_id, task_id, policy, role, "
        "?, reward, min_version, max_version, n_tokens, tokens, loss_mask, logprobs, versions, "
        "turn_rewards "
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


_NODE_OF_SAMPLE = (
    "SELECT s.id, s.group_id, l.node_id, COALESCE(json_extract(n.body, '$.name'), '') || ' (' || "
    "l.node_id || ')' FROM samples s JOIN leases l ON l.id = s.lease_id "
    "LEFT JOIN nodes n ON n.id = l.node_id "
)


class PushedBy(NamedTuple):
    """The node that pushed a sample: its id and how /status and metrics.jsonl name it."""

    node_id: str
    label: str  # "name (node id)"


def nodes_of_samples(tx: Tx, batch_id: str, sample_ids: list[str]) -> dict[str, PushedBy]:
    """sample id -> the node that pushed it, for samples of ``batch_id`` (ids not in that batch
    are left out: a trainer cannot blame other batches' samples)."""
    groups = {r[0] for r in tx.execute("SELECT id FROM groups WHERE batch_id=?", (batch_id,))}
    rows = tx.select_in(_NODE_OF_SAMPLE + "WHERE s.id IN ({marks})", sample_ids)
    return {sid: PushedBy(nid, label) for sid, group, nid, label in rows if group in groups}


def nodes_of_batch(tx: Tx, batch_id: str) -> dict[str, int]:
    """ "name (node id)" -> samples of ``batch_id`` it pushed."""
    out: dict[str, int] = {}
    for _, _, _, node in tx.execute(
        _NODE_OF_SAMPLE + "WHERE s.group_id IN (SELECT id FROM groups WHERE batch_id=?)",
        (batch_id,),
    ):
        out[node] = out.get(node, 0) + 1
    return out
