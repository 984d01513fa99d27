"""Invariants of a finished run, read back from its dataflow store (``run_dir/dataflow.db``).

Pure functions over a read-only SQLite connection, so a bench and a test share them. The store's
schema is ``astraflow/dataflow/store.py``; the rules they check are the dataflow's (leases cover
whole groups, the first lease to deliver a whole group wins its task, superseded samples are
deleted, a lease that expires or is released puts its task back in the queue).

*Lost* tasks (must be 0):

* ``orphaned``: a task in state ``leased`` with no active lease: nobody is working on it and it is
  not in the queue, so it would never be done;
* ``done_without_data``: a task marked done whose winning lease did not deliver ``group_size``
  episodes (an acknowledged push whose data is missing);
* ``group_short``: a training task done with trainable samples but whose group holds fewer samples
  than the winning lease delivered (samples lost between ingestion and the group).

*Duplicated* tasks (must be 0):

* ``multi_lease_samples``: a training task whose stored samples come from more than one lease;
* ``multi_winner``: a task with more than one ``finished`` lease;
* ``oversized_group``: a group with more samples than its task's ``group_size`` per role;
* ``group_in_two_batches``: a group that appears in the layout of more than one batch that was
  acknowledged (trained twice).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any


def open_ro(db_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30.0)


def check_store(db_path: Path) -> dict[str, Any]:
    """``tasks_lost``, ``tasks_duplicated`` and their breakdowns, plus context counts."""
    conn = open_ro(db_path)
    try:
        return _check(conn)
    finally:
        conn.close()


def _check(conn: sqlite3.Connection) -> dict[str, Any]:
    lost: dict[str, list[str]] = {
        "orphaned": [
            r[0]
            for r in conn.execute(
                "SELECT id FROM tasks t WHERE state='leased' AND NOT EXISTS "
                "(SELECT 1 FROM leases l WHERE l.task_id=t.id AND l.state='active')"
            )
        ],
        "done_without_data": [
            r[0]
            for r in conn.execute(
                "SELECT t.id FROM tasks t LEFT JOIN leases l ON l.id = t.winner "
                "WHERE t.state='done' AND (l.id IS NULL OR l.episodes < t.group_size "
                "OR (SELECT COUNT(*) FROM episodes e WHERE e.lease_id = t.winner) < t.group_size)"
            )
        ],
        "group_short": [
            r[0]
            for r in conn.execute(
                "SELECT g.id FROM groups g WHERE g.size != "
                "(SELECT COUNT(*) FROM samples s WHERE s.group_id = g.id) "
                "AND g.state IN ('ready', 'batched')"
            )
        ],
    }
    dup: dict[str, list[str]] = {
        "multi_lease_samples": [
            r[0]
            for r in conn.execute(
                "SELECT task_id FROM samples GROUP BY task_id HAVING COUNT(DISTINCT lease_id) > 1"
            )
        ],
        "multi_winner": [
            r[0]
            for r in conn.execute(
                "SELECT task_id FROM leases WHERE state='finished' GROUP BY task_id "
                "HAVING COUNT(*) > 1"
            )
        ],
        "oversized_group": [
            r[0]
            for r in conn.execute(
                "SELECT g.id FROM groups g JOIN tasks t ON t.id = g.task_id "
                "WHERE (SELECT COUNT(*) FROM samples s WHERE s.group_id = g.id) > "
                "t.group_size * (SELECT COUNT(DISTINCT role) FROM samples s2 "
                "WHERE s2.group_id = g.id)"
            )
        ],
        "group_in_two_batches": _groups_trained_twice(conn),
    }
    lost_tasks = {t for ids in lost.values() for t in ids}
    dup_tasks = {_task_of(x) for ids in dup.values() for x in ids}
    lease_states = dict(
        conn.execute("SELECT state, COUNT(*) FROM leases GROUP BY state").fetchall()
    )
    task_states = dict(
        conn.execute("SELECT state, COUNT(*) FROM tasks WHERE is_eval=0 GROUP BY state").fetchall()
    )
    return {
        "tasks_lost": len(lost_tasks),
        "tasks_duplicated": len(dup_tasks),
        "lost": {k: v[:20] for k, v in lost.items()},
        "duplicated": {k: v[:20] for k, v in dup.items()},
        "tasks_by_state": task_states,
        "leases_by_state": lease_states,
        "superseded_leases": int(lease_states.get("superseded", 0)),
        "expired_leases": int(lease_states.get("expired", 0)),
        "released_leases": int(lease_states.get("released", 0)),
        "pushes_rejected": _rejected_pushes(conn),
    }


def _rejected_pushes(conn: sqlite3.Connection) -> dict[str, int]:
    """Pushes the service refused, by reason (e.g. a partitioned node's late group for a task
    another node finished first): the first-finisher-wins rule at work."""
    import msgpack

    out: Counter[str] = Counter()
    for (blob,) in conn.execute("SELECT result FROM idempotency WHERE kind='push'"):
        try:
            result = msgpack.unpackb(blob, raw=False)
        except Exception:  # noqa: BLE001 - a record of another format: not ours to judge
            continue
        if isinstance(result, dict) and not result.get("accepted", True):
            reason = str(result.get("reason") or "")
            key = "completed_by_another_lease" if "first finisher" in reason else reason[:60]
            out[key] += 1
    return dict(out)


def _task_of(group_or_task: str) -> str:
    """Group ids are ``{task_id}/{policy}``; task ids have no '/'."""
    return group_or_task.split("/", 1)[0]


def _groups_trained_twice(conn: sqlite3.Connection) -> list[str]:
    seen: Counter[str] = Counter()
    for (layout,) in conn.execute("SELECT layout FROM batches WHERE state='acked'"):
        try:
            entries = json.loads(layout)
        except ValueError:
            continue
        for entry in entries:
            if isinstance(entry, list) and entry:
                seen[str(entry[0])] += 1
    return [g for g, n in seen.items() if n > 1]


def episodes_by_region(db_path: Path) -> dict[str, dict[str, Any]]:
    """Training episodes per region and per node, with each node's active window."""
    conn = open_ro(db_path)
    try:
        nodes = {}
        for node_id, body, registered, last in conn.execute(
            "SELECT id, body, registered_at, last_heartbeat FROM nodes"
        ):
            try:
                reg = json.loads(body)
            except ValueError:
                reg = {}
            nodes[node_id] = {
                "name": reg.get("name", ""),
                "region": reg.get("region", "?"),
                "registered_at": registered,
                "last_heartbeat": last,
            }
        out: dict[str, dict[str, Any]] = {}
        for node_id, n, first, last in conn.execute(
            "SELECT node_id, COUNT(*), MIN(created_at), MAX(created_at) FROM episodes "
            "WHERE is_eval=0 GROUP BY node_id"
        ):
            info = nodes.get(node_id, {"name": node_id, "region": "?"})
            region = out.setdefault(info["region"], {"episodes": 0, "nodes": {}})
            region["episodes"] += n
            region["nodes"][info["name"] or node_id] = {
                "episodes": n,
                "first": first,
                "last": last,
                "registered_at": info.get("registered_at"),
            }
        return out
    finally:
        conn.close()
