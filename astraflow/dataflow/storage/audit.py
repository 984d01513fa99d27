"""The store's own bookkeeping checked against the rules it promises: no task lost, none trained
twice. Read once when the service stops (:mod:`.run_summary`), so a finished run's metrics file says
whether those rules held; the chaos and cross-region benchmarks and their tests require zeros.

* lost: ``orphaned`` (a task marked leased with no live lease), ``done_without_data`` (a task
  marked done whose winning lease did not deliver a whole group), ``group_short`` (a ready or
  batched group with fewer samples than its size);
* duplicated: ``multi_lease_samples`` (one task's samples from two leases), ``multi_winner`` (two
  finished leases of one task), ``oversized_group`` (more samples than group size x roles),
  ``group_in_two_batches`` (a group trained in two acknowledged batches), and the count of
  ``samples_trained_twice``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from astraflow.dataflow.storage.store import Tx

#: Ids listed per kind of violation (the counts cover them all).
SHOWN = 20


def check(tx: Tx) -> dict[str, Any]:
    """``tasks_lost`` and ``tasks_duplicated`` (both 0 in a healthy run), their breakdowns, lease
    and task counts by state, and the pushes the service refused by reason."""
    lost: dict[str, list[str]] = {
        "orphaned": _ids(
            tx,
            "SELECT id FROM tasks t WHERE state='leased' AND NOT EXISTS "
            "(SELECT 1 FROM leases l WHERE l.task_id=t.id AND l.state='active')",
        ),
        "done_without_data": _ids(
            tx,
            "SELECT t.id FROM tasks t LEFT JOIN leases l ON l.id = t.winner "
            "WHERE t.state='done' AND (l.id IS NULL OR l.episodes < t.group_size "
            "OR (SELECT COUNT(*) FROM episodes e WHERE e.lease_id = t.winner) < t.group_size)",
        ),
        "group_short": _ids(
            tx,
            "SELECT g.id FROM groups g WHERE g.size != "
            "(SELECT COUNT(*) FROM samples s WHERE s.group_id = g.id) "
            "AND g.state IN ('ready', 'batched')",
        ),
    }
    trained = _trained_groups_and_samples(tx)
    dup: dict[str, list[str]] = {
        "multi_lease_samples": _ids(
            tx, "SELECT task_id FROM samples GROUP BY task_id HAVING COUNT(DISTINCT lease_id) > 1"
        ),
        "multi_winner": _ids(
            tx,
            "SELECT task_id FROM leases WHERE state='finished' GROUP BY task_id "
            "HAVING COUNT(*) > 1",
        ),
        "oversized_group": _ids(
            tx,
            "SELECT g.id FROM groups g JOIN tasks t ON t.id = g.task_id "
            "WHERE (SELECT COUNT(*) FROM samples s WHERE s.group_id = g.id) > "
            "t.group_size * (SELECT COUNT(DISTINCT role) FROM samples s2 "
            "WHERE s2.group_id = g.id)",
        ),
        "group_in_two_batches": [g for g, n in trained[0].items() if n > 1],
    }
    lease_states = dict(tx.execute("SELECT state, COUNT(*) FROM leases GROUP BY state"))
    task_states = dict(
        tx.execute("SELECT state, COUNT(*) FROM tasks WHERE is_eval=0 GROUP BY state")
    )
    return {
        "tasks_lost": len({t for ids in lost.values() for t in ids}),
        "tasks_duplicated": len({_task_of(x) for ids in dup.values() for x in ids}),
        "samples_trained_twice": sum(n - 1 for n in trained[1].values() if n > 1),
        "lost": {k: v[:SHOWN] for k, v in lost.items()},
        "duplicated": {k: v[:SHOWN] for k, v in dup.items()},
        "tasks_by_state": task_states,
        "leases_by_state": lease_states,
        "superseded_leases": int(lease_states.get("superseded", 0)),
        "expired_leases": int(lease_states.get("expired", 0)),
        "released_leases": int(lease_states.get("released", 0)),
        "pushes_rejected": _rejected_pushes(tx),
    }


def _ids(tx: Tx, sql: str) -> list[str]:
    return [str(row[0]) for row in tx.execute(sql)]


def _task_of(group_or_task: str) -> str:
    """Group ids are ``{task_id}/{policy}``; task ids have no '/'."""
    return group_or_task.split("/", 1)[0]


def _trained_groups_and_samples(tx: Tx) -> tuple[Counter[str], Counter[str]]:
    """How often each group and each sample appears in acknowledged batches (their layouts are
    ``[[group_id, [[sample_id, ...], ...]], ...]``)."""
    groups: Counter[str] = Counter()
    samples: Counter[str] = Counter()
    for (layout,) in tx.execute("SELECT layout FROM batches WHERE state='acked'"):
        try:
            entries = json.loads(layout)
        except ValueError:
            continue
        for entry in entries:
            if isinstance(entry, list) and entry:
                groups[str(entry[0])] += 1
                for sample in entry[1] if len(entry) > 1 else []:
                    if isinstance(sample, list) and sample:
                        samples[str(sample[0])] += 1
    return groups, samples


def _rejected_pushes(tx: Tx) -> dict[str, int]:
    """Pushes the service refused, by reason (e.g. a partitioned node's late group for a task
    another node finished first): the first-finisher-wins rule at work."""
    import msgpack

    out: Counter[str] = Counter()
    for (blob,) in tx.execute("SELECT result FROM idempotency WHERE kind='push'"):
        try:
            result = msgpack.unpackb(blob, raw=False)
        except Exception:  # noqa: BLE001 - a record of another format: not ours to judge
            continue
        if isinstance(result, dict) and not result.get("accepted", True):
            reason = str(result.get("reason") or "")
            key = "completed_by_another_lease" if "first finisher" in reason else reason[:60]
            out[key] += 1
    return dict(out)
