"""The dataflow store's SQL, one module per table family.

Why: the domain modules (leases, ingest, batching, ...) say what happens to the run; the SQL that
records it lives here, named by what it does (``nodes.mark_left(tx, node_id)``), so a reader sees
each table's statements side by side and a schema change touches one module. Every function takes
the operation's :class:`~astraflow.dataflow.store.Tx` (the store's single writer thread) and runs
its statements as they were written in the domain modules. The schema, the ``meta`` table and
transaction control stay in :mod:`astraflow.dataflow.store`; no other module of the service holds
SQL (``tests/test_layering.py``).
"""

from astraflow.dataflow.storage import (
    batches,
    episodes,
    evaluations,
    feeder,
    groups,
    idempotency,
    leases,
    metric_records,
    nodes,
    policy_state,
    replays,
    samples,
    staleness,
    tallies,
    tasks,
    versions,
)

__all__ = [
    "batches",
    "episodes",
    "evaluations",
    "feeder",
    "groups",
    "idempotency",
    "leases",
    "metric_records",
    "nodes",
    "policy_state",
    "replays",
    "samples",
    "staleness",
    "tallies",
    "tasks",
    "versions",
]
