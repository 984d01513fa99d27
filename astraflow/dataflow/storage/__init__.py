"""The dataflow store's SQL, one module per table family.

Why: the domain modules (leases, ingest, batching, ...) say what happens to the run; the SQL that
records it lives here, named by what it does (``nodes.mark_left(tx, node_id)``), so a reader sees
each table's statements side by side and a schema change touches one module. Every function takes
the operation's :class:`~astraflow.dataflow.storage.store.Tx` (the store's single writer thread) and
runs its statements as they were written in the domain modules. The schema, the ``meta`` table and
transaction control stay in :mod:`astraflow.dataflow.storage.store`; no other module of the service
holds SQL (``tests/project/test_layering.py``).
"""

from astraflow.dataflow.storage import (
    audit,
    batches,
    episodes,
    evaluations,
    feeder,
    groups,
    history,
    idempotency,
    leases,
    metric_records,
    nodes,
    partials,
    policy_state,
    replays,
    run_summary,
    samples,
    staleness,
    tallies,
    tasks,
    transcripts,
    versions,
)

__all__ = [
    "audit",
    "batches",
    "episodes",
    "evaluations",
    "feeder",
    "groups",
    "history",
    "idempotency",
    "leases",
    "metric_records",
    "nodes",
    "partials",
    "policy_state",
    "replays",
    "run_summary",
    "samples",
    "staleness",
    "tallies",
    "tasks",
    "transcripts",
    "versions",
]
