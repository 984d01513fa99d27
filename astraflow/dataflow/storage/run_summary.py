"""Figures of a whole run that only the store holds, read once when the service stops.

They are too costly for every ``GET /status`` (table scans over leases, episodes and samples) and
are only needed after the run: the service writes them, with the final status document, as the
last record of ``metrics.jsonl`` (:meth:`astraflow.dataflow.ops.service.DataflowService.stop`),
which is where benchmarks and post-mortems read a finished run, never the store itself.
"""

from __future__ import annotations

import json
from typing import Any

from astraflow.dataflow.storage import audit
from astraflow.dataflow.storage.store import Tx


def read(tx: Tx) -> dict[str, Any]:
    """The run's clock, its rollout and training history, and the store's :func:`audit.check`:

    * ``first_version_at`` (the first weight version announced), ``first_lease_at`` (the first
      lease issued), ``train_episodes`` (training episodes pushed);
    * ``batches``: per policy, ``[served, done with]`` of every batch the trainer finished
      (acknowledged or skipped), in serving order (the trainer idles between one and the next);
    * ``acked``: per policy, ``[step, batch_id]`` of the acknowledged batches in step order;
    * ``versions``: per policy, ``[version, announced_at, full_bytes]`` in version order;
    * ``leases``: ``[node_id, issued_at, first_push_at, episodes]`` of every training lease that
      delivered episodes (its episodes were in flight on the node in between);
    * ``nodes``: per node id, its name, region, registration, last heartbeat, and its training
      episodes with the first and last one's time;
    * ``audit``: :func:`audit.check`.
    """
    batches: dict[str, list[list[float]]] = {}
    for policy, created, acked in tx.execute(
        "SELECT policy, created_at, acked_at FROM batches WHERE acked_at IS NOT NULL "
        "ORDER BY created_at"
    ):
        batches.setdefault(policy, []).append([float(created), float(acked)])
    acked: dict[str, list[list[Any]]] = {}
    for policy, step, batch_id in tx.execute(
        "SELECT policy, step, id FROM batches WHERE state='acked' ORDER BY policy, step"
    ):
        acked.setdefault(policy, []).append([step, batch_id])
    versions: dict[str, list[list[Any]]] = {}
    for policy, version, body, created in tx.execute(
        "SELECT policy, version, body, created_at FROM versions ORDER BY policy, version"
    ):
        full_bytes = json.loads(body).get("full_bytes") if body else None
        versions.setdefault(policy, []).append([version, created, full_bytes])
    leases = [
        [node, issued, first, n]
        for node, issued, first, n in tx.execute(
            "SELECT l.node_id, l.issued_at, MIN(e.created_at), COUNT(e.id) FROM leases l "
            "JOIN episodes e ON e.lease_id = l.id WHERE e.is_eval = 0 GROUP BY l.id "
            "ORDER BY l.issued_at"
        )
    ]
    return {
        "first_version_at": tx.scalar("SELECT MIN(created_at) FROM versions"),
        "first_lease_at": tx.scalar("SELECT MIN(issued_at) FROM leases"),
        "train_episodes": tx.scalar("SELECT COUNT(*) FROM episodes WHERE is_eval = 0", (), 0),
        "batches": batches,
        "acked": acked,
        "versions": versions,
        "leases": leases,
        "nodes": _nodes(tx),
        "audit": audit.check(tx),
    }


def _nodes(tx: Tx) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for node_id, body, registered, last in tx.execute(
        "SELECT id, body, registered_at, last_heartbeat FROM nodes"
    ):
        try:
            reg = json.loads(body)
        except ValueError:
            reg = {}
        out[node_id] = {
            "name": reg.get("name", ""),
            "region": reg.get("region", ""),
            "registered_at": registered,
            "last_heartbeat": last,
            "episodes": 0,
            "first_episode_at": None,
            "last_episode_at": None,
        }
    for node_id, n, first, last in tx.execute(
        "SELECT node_id, COUNT(*), MIN(created_at), MAX(created_at) FROM episodes "
        "WHERE is_eval=0 GROUP BY node_id"
    ):
        node = out.setdefault(node_id, {"name": node_id, "region": ""})
        node.update(episodes=n, first_episode_at=first, last_episode_at=last)
    return out
