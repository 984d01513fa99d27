"""A run's history, table by table, as typed rows: what tools and tests read from a store to
inspect a run beside it or after it (``store.read_only`` on a finished run's file, or
``Store.call`` on a live one).

Why here: the store's schema is the dataflow's own. Reading it with SQL of one's own (tests,
benches, helpers) broke silently whenever a column moved; these functions change with the schema,
in the one package that holds SQL (``tests/project/test_layering.py``). Whole-table reads: never
called on the service's hot paths.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import numpy as np

from astraflow.dataflow.storage import partials as partials_table
from astraflow.dataflow.storage.packed import unstore
from astraflow.dataflow.storage.partials import PartialRow
from astraflow.dataflow.storage.store import Tx


class TaskRecord(NamedTuple):
    id: str
    task_set: str
    is_eval: bool
    #: ``pending`` | ``leased`` | ``done`` (evaluation tasks also ``cancelled``)
    state: str
    #: the lease whose group counted, or ``skipped:<reason>`` for a task a policy skipped
    winner: str | None
    group_size: int


class LeaseRecord(NamedTuple):
    id: str
    task_id: str
    node_id: str
    #: ``active`` -> ``finished`` | ``expired`` | ``released`` | ``superseded``
    state: str
    #: episodes pushed on this lease
    episodes: int
    #: the versions the node held when it was granted
    versions: dict[str, int]
    is_eval: bool
    issued_at: float


class EpisodeRecord(NamedTuple):
    id: str
    task_id: str
    lease_id: str
    node_id: str
    is_eval: bool
    finish_reason: str
    error: str | None
    rewards: dict[str, float]
    #: the node's ``info`` of the episode (the env's info and the workflow's metrics)
    info: dict[str, Any]


class SampleRecord(NamedTuple):
    id: str
    group_id: str | None
    #: the batch its group was served in (None: not served)
    batch_id: str | None
    policy: str
    role: str
    reward: float
    n_tokens: int
    #: bytes of the token array still stored (0 once a checkpoint covers the sample's step)
    stored_token_bytes: int
    #: the per-turn rewards kept with the sample (JSON list), or None
    turn_rewards: str | None


class SampleArrays(NamedTuple):
    """A buffered sample's token arrays as a trainer would be served them."""

    id: str
    episode_id: str
    task_id: str
    lease_id: str
    policy: str
    role: str
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]


class BatchRecord(NamedTuple):
    id: str
    policy: str
    #: ``served`` | ``acked`` | ``skipped`` | ``rewound``
    state: str
    #: the optimizer step it was acknowledged as (None: not acknowledged)
    step: int | None
    group_ids: list[str]
    sample_ids: list[str]


class VersionRecord(NamedTuple):
    policy: str
    version: int
    digest: str
    created_at: float


class ReplayRecord(NamedTuple):
    group_id: str
    #: the group it re-serves and the original group that one came from
    source: str
    origin: str
    #: how many times ``origin`` has been replayed so far
    n: int


def tasks(tx: Tx) -> list[TaskRecord]:
    """Every task, in the order the feeder enqueued them."""
    return [
        TaskRecord(i, s, bool(e), st, w, g)
        for i, s, e, st, w, g in tx.execute(
            "SELECT id, task_set, is_eval, state, winner, group_size FROM tasks ORDER BY seq"
        )
    ]


def leases(tx: Tx) -> list[LeaseRecord]:
    """Every lease, in the order it was granted."""
    return [
        LeaseRecord(i, t, n, st, eps, json.loads(v), bool(e), at)
        for i, t, n, st, eps, v, e, at in tx.execute(
            "SELECT id, task_id, node_id, state, episodes, versions, is_eval, issued_at "
            "FROM leases ORDER BY issued_at, rowid"
        )
    ]


def episodes(tx: Tx) -> list[EpisodeRecord]:
    """Every pushed episode, in the order it was stored."""
    return [
        EpisodeRecord(
            i, t, lid, n, bool(e), fr, err, json.loads(r or "{}"), json.loads(inf or "{}")
        )
        for i, t, lid, n, e, fr, err, r, inf in tx.execute(
            "SELECT id, task_id, lease_id, node_id, is_eval, finish_reason, error, rewards, info "
            "FROM episodes ORDER BY rowid"
        )
    ]


def samples(tx: Tx) -> list[SampleRecord]:
    """Every sample row (replayed copies included), with the batch its group was served in."""
    return tx.rows(
        SampleRecord,
        "SELECT s.id, s.group_id, g.batch_id, s.policy, s.role, s.reward, s.n_tokens, "
        "length(s.tokens), s.turn_rewards FROM samples s LEFT JOIN groups g ON g.id = s.group_id "
        "ORDER BY s.rowid",
    )


def batches(tx: Tx) -> list[BatchRecord]:
    """Every batch, in the order it was formed, with the groups and samples it served."""
    out = []
    for i, p, st, step, layout in tx.execute(
        "SELECT id, policy, state, step, layout FROM batches ORDER BY seq"
    ):
        entries = json.loads(layout)
        out.append(
            BatchRecord(
                i,
                p,
                st,
                step,
                [g for g, _ in entries],
                [sample[0] for _, samples_ in entries for sample in samples_],
            )
        )
    return out


def versions(tx: Tx) -> list[VersionRecord]:
    """Every announced version still on the timeline, in announcement order."""
    return [
        VersionRecord(p, v, json.loads(body).get("digest", ""), at)
        for p, v, body, at in tx.execute(
            "SELECT policy, version, body, created_at FROM versions ORDER BY created_at"
        )
    ]


def replays(tx: Tx) -> list[ReplayRecord]:
    """Every replayed group, in the order it was made."""
    return tx.rows(ReplayRecord, "SELECT group_id, source, origin, n FROM replays ORDER BY rowid")


def partials(tx: Tx) -> list[PartialRow]:
    """Every episode saved in flight and not yet done with (its task not complete), by task and
    episode index, decoded (``PartialRow.partial`` is the ``PartialEpisode``)."""
    return partials_table.all_rows(tx)


def sample_arrays(tx: Tx) -> list[SampleArrays]:
    """Every sample whose token arrays are still stored, decoded (samples whose arrays were
    freed once a checkpoint covered their step are left out)."""
    out = []
    for i, ep, t, lid, p, r, tok, mask, lps, vers in tx.execute(
        "SELECT id, episode_id, task_id, lease_id, policy, role, tokens, loss_mask, logprobs, "
        "versions FROM samples WHERE length(tokens) > 0 ORDER BY rowid"
    ):
        tok, mask, lps, vers = unstore(tok, mask, lps, vers)
        out.append(
            SampleArrays(
                i,
                ep,
                t,
                lid,
                p,
                r,
                np.frombuffer(tok, dtype="<i4").tolist(),
                np.frombuffer(mask, dtype="<i4").tolist(),
                np.frombuffer(lps, dtype="<f4").tolist(),
                np.frombuffer(vers, dtype="<i4").tolist(),
            )
        )
    return out


class TableSize(NamedTuple):
    #: rows of the table (0 for an index)
    rows: int
    #: bytes of its pages in the file, its indexes' pages included
    bytes: int


def table_sizes(tx: Tx) -> dict[str, TableSize]:
    """Rows and bytes of each table of the store (``dbstat``: the pages each table and its
    indexes hold), for the scale bench's question of what a long run keeps and how much."""
    owner = dict(
        tx.execute("SELECT name, tbl_name FROM sqlite_schema WHERE type IN ('table', 'index')")
    )
    sizes: dict[str, int] = {}
    for name, pages in tx.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
        table = owner.get(name, name)
        sizes[table] = sizes.get(table, 0) + int(pages)
    out = {}
    for table, size in sizes.items():
        if table.startswith("sqlite_"):
            continue
        rows = int(tx.scalar(f'SELECT COUNT(*) FROM "{table}"', (), 0))
        out[table] = TableSize(rows, size)
    return out
