"""Registered rollout nodes (``nodes``): membership, liveness, versions held, metrics."""

from __future__ import annotations

import json

from astraflow.dataflow.store import Tx


def insert(tx: Tx, node_id: str, body: str, versions: dict[str, int], now: float) -> None:
    tx.execute(
        "INSERT INTO nodes(id, body, versions, state, registered_at, last_heartbeat) "
        "VALUES(?,?,?,'active',?,?)",
        (node_id, body, json.dumps(versions), now, now),
    )


def silent_named(tx: Tx, name: str, silent_since: float) -> list[str]:
    """Active nodes called ``name`` that have not sent a heartbeat since ``silent_since``."""
    return [
        node_id
        for (node_id,) in tx.execute(
            "SELECT id FROM nodes WHERE state='active' AND last_heartbeat < ? "
            "AND json_extract(body, '$.name') = ?",
            (silent_since, name),
        ).fetchall()
    ]


def mark_left(tx: Tx, node_id: str) -> None:
    tx.execute("UPDATE nodes SET state='left' WHERE id=?", (node_id,))


def state(tx: Tx, node_id: str) -> str | None:
    """'active' or 'left'; None for a node never registered."""
    row = tx.one("SELECT state FROM nodes WHERE id=?", (node_id,))
    return None if row is None else row[0]


def states(tx: Tx, node_ids: list[str]) -> dict[str, str]:
    """:func:`state` of many nodes in a few statements; unregistered ids are absent."""
    return dict(tx.select_in("SELECT id, state FROM nodes WHERE id IN ({marks})", node_ids))


def touch(tx: Tx, node_id: str, now: float, versions: dict[str, int] | None) -> None:
    """Record a sign of life (and, given, the versions the node holds now)."""
    if versions:
        tx.execute(
            "UPDATE nodes SET last_heartbeat=?, versions=? WHERE id=?",
            (now, json.dumps(versions), node_id),
        )
    else:
        tx.execute("UPDATE nodes SET last_heartbeat=? WHERE id=?", (now, node_id))


def set_metrics(tx: Tx, node_id: str, metrics: dict[str, float]) -> None:
    tx.execute("UPDATE nodes SET metrics=? WHERE id=?", (json.dumps(metrics), node_id))


def add_episodes(tx: Tx, node_id: str, n: int) -> None:
    tx.execute("UPDATE nodes SET episodes = episodes + ? WHERE id=?", (n, node_id))


def active_metrics(tx: Tx) -> dict[str, dict[str, float]]:
    """Each active node's latest heartbeat metrics (throughput, weight-sync times), by name."""
    out: dict[str, dict[str, float]] = {}
    for nid, body, metrics in tx.execute(
        "SELECT id, body, metrics FROM nodes WHERE state='active' ORDER BY registered_at"
    ):
        out[json.loads(body).get("name") or nid] = json.loads(metrics)
    return out


def all_rows(tx: Tx) -> list[tuple]:
    """(id, body, versions, state, last_heartbeat, episodes, metrics) of every node, oldest
    first."""
    return tx.execute(
        "SELECT id, body, versions, state, last_heartbeat, episodes, metrics FROM nodes "
        "ORDER BY registered_at"
    ).fetchall()
