"""Registered rollout nodes (``nodes``): membership, liveness, versions held, metrics."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import NamedTuple

from astraflow.dataflow.storage.store import Tx

#: Nodes that left, newest first, that /status still lists.
LEFT_NODES_SHOWN = 64
#: Active nodes whose metrics each step line of metrics.jsonl carries.
METRIC_NODES_SHOWN = 64


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


def silent_since(tx: Tx, before: float, limit: int) -> list[str]:
    """Up to ``limit`` active nodes with no sign of life since ``before``, longest silent first."""
    return [
        node_id
        for (node_id,) in tx.execute(
            "SELECT id FROM nodes WHERE state='active' AND last_heartbeat < ? "
            "ORDER BY last_heartbeat LIMIT ?",
            (before, limit),
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


def last_heartbeat(tx: Tx, node_id: str) -> float | None:
    """When the node's last sign of life was recorded (None: never registered)."""
    return tx.scalar("SELECT last_heartbeat FROM nodes WHERE id=?", (node_id,))


def set_metrics(tx: Tx, node_id: str, metrics: dict[str, float]) -> None:
    tx.execute("UPDATE nodes SET metrics=? WHERE id=?", (json.dumps(metrics), node_id))


def add_episodes(tx: Tx, node_id: str, n: int) -> None:
    tx.execute("UPDATE nodes SET episodes = episodes + ? WHERE id=?", (n, node_id))


def active_metrics(tx: Tx) -> dict[str, dict[str, float]]:
    """The latest heartbeat metrics (throughput, weight-sync times) of the first
    :data:`METRIC_NODES_SHOWN` active nodes, by name (each step line of metrics.jsonl has them)."""
    out: dict[str, dict[str, float]] = {}
    for nid, body, metrics in tx.execute(
        "SELECT id, body, metrics FROM nodes WHERE state='active' ORDER BY registered_at LIMIT ?",
        (METRIC_NODES_SHOWN,),
    ):
        out[json.loads(body).get("name") or nid] = json.loads(metrics)
    return out


def listed_rows(tx: Tx, silent_before: float, limit: int) -> list[tuple]:
    """(id, body, versions, state, last_heartbeat, episodes, metrics) of the nodes /status
    lists, oldest first: at most ``limit`` active ones (those silent since ``silent_before``
    first, oldest heartbeat first, then the longest registered) and the :data:`LEFT_NODES_SHOWN`
    that left last. Bounded whatever the pool's size: the rest are counted by :func:`summary`."""
    cols = "id, body, versions, state, last_heartbeat, episodes, metrics, registered_at"
    rows = tx.execute(
        f"SELECT * FROM (SELECT {cols} FROM nodes WHERE state='active' AND last_heartbeat < ? "
        "ORDER BY last_heartbeat LIMIT ?) UNION ALL "
        f"SELECT * FROM (SELECT {cols} FROM nodes WHERE state='active' AND last_heartbeat >= ? "
        "ORDER BY registered_at LIMIT ?) UNION ALL "
        f"SELECT * FROM (SELECT {cols} FROM nodes WHERE state='left' "
        "ORDER BY registered_at DESC LIMIT ?)",
        (silent_before, limit, silent_before, limit, LEFT_NODES_SHOWN),
    ).fetchall()
    active = [r for r in rows if r[3] == "active"][:limit]
    left = [r for r in rows if r[3] != "active"]
    return [row[:7] for row in sorted(active + left, key=lambda r: r[7])]


class NodeCounts(NamedTuple):
    """Active nodes of one region, split by liveness."""

    region: str
    active: int
    silent: int
    episodes: int


def summary(tx: Tx, silent_before: float) -> tuple[list[NodeCounts], int, int]:
    """Active nodes per region (live and silent since ``silent_before``, episodes pushed), the
    nodes that left and their episodes: what /status says of the nodes it does not list."""
    regions = [
        NodeCounts(str(region or ""), int(live), int(silent), int(episodes or 0))
        for region, live, silent, episodes in tx.execute(
            "SELECT json_extract(body, '$.region'), SUM(last_heartbeat >= ?), "
            "SUM(last_heartbeat < ?), SUM(episodes) FROM nodes WHERE state='active' "
            "GROUP BY 1 ORDER BY 1",
            (silent_before, silent_before),
        )
    ]
    left, left_episodes = tx.one(
        "SELECT COUNT(*), COALESCE(SUM(episodes), 0) FROM nodes WHERE state='left'"
    )
    return regions, int(left), int(left_episodes)


def count_active(tx: Tx) -> int:
    return int(tx.scalar("SELECT COUNT(*) FROM nodes WHERE state='active'", (), 0))


def issue_key(tx: Tx, node_id: str) -> str:
    """A fresh credential for ``node_id``; only its sha256 is stored (``meta``)."""
    key = secrets.token_urlsafe(24)
    tx.set_meta(f"node_key:{node_id}", hashlib.sha256(key.encode()).hexdigest())
    return key


def key_matches(tx: Tx, node_id: str, key: str) -> bool:
    """Whether ``key`` is the credential issued to ``node_id`` (False for unknown nodes)."""
    stored = tx.get_meta(f"node_key:{node_id}")
    digest = hashlib.sha256(key.encode()).hexdigest()
    return stored is not None and hmac.compare_digest(stored, digest)


def metrics_of(tx: Tx, node_id: str) -> dict[str, float]:
    row = tx.one("SELECT metrics FROM nodes WHERE id=?", (node_id,))
    return json.loads(row[0]) if row and row[0] else {}


def add_counter(tx: Tx, node_id: str, name: str, n: int) -> None:
    """Add ``n`` to a service-side counter in the node's /status metrics (kept across the
    node's own heartbeats, see ``leasing.kept_metrics``)."""
    metrics = metrics_of(tx, node_id)
    metrics[name] = metrics.get(name, 0.0) + n
    set_metrics(tx, node_id, metrics)
