"""GET /status: builds the status document (its types live in ``astraflow.protocol.status``)."""

from __future__ import annotations

import json

from astraflow.dataflow import evaluations, state, storage
from astraflow.dataflow.context import Context
from astraflow.dataflow.leases import nodes_done
from astraflow.dataflow.store import Tx
from astraflow.protocol.status import DataflowStatus, NodeStatus, PolicyStatus

#: Window for node throughput (episodes per second over the last minute).
THROUGHPUT_WINDOW_S = 60.0


def build(ctx: Context, tx: Tx) -> DataflowStatus:
    now = ctx.now()
    cfg = ctx.config
    recipe = cfg.recipe
    queue: dict[str, int] = {}
    for task_set, is_eval, n in storage.tasks.pending_by_set(tx):
        key = "eval" if is_eval else task_set
        queue[key] = queue.get(key, 0) + n
    lease_counts = storage.leases.counts_by_state(tx)
    since = now - THROUGHPUT_WINDOW_S
    recent = dict(storage.episodes.counts_by_node_since(tx, since))
    active = storage.leases.active_by_node(tx)
    nodes = []
    for nid, body, versions, n_state, last_hb, episodes, metrics in storage.nodes.all_rows(tx):
        reg = json.loads(body)
        silent = now - last_hb
        shown_state = n_state
        if n_state == "active" and silent > cfg.lease_timeout_s:
            shown_state = "silent"
        nodes.append(
            NodeStatus(
                id=nid,
                name=reg.get("name", ""),
                region=reg.get("region", ""),
                state=shown_state,
                last_heartbeat=last_hb,
                seconds_since_heartbeat=round(silent, 3),
                versions=json.loads(versions),
                episodes=episodes,
                episodes_per_s=recent.get(nid, 0) / THROUGHPUT_WINDOW_S,
                active_leases=active.get(nid, 0),
                metrics=json.loads(metrics),
            )
        )
    latest = storage.versions.latest_weights(tx)
    steps = storage.batches.steps(tx)
    drops = storage.tallies.drops.by_policy(tx)
    counters = storage.tallies.counters.by_policy(tx)
    buffers = {p: (g, s) for p, g, s in storage.groups.buffered(tx)}
    unacked = dict(storage.batches.unacked_counts(tx))
    hist: dict[str, dict[str, int]] = {}
    for p, k, v in storage.staleness.histogram(tx):
        hist.setdefault(p, {})[str(k)] = v
    policies = {}
    for name, pc in recipe.policies.items():
        wv = latest.get(name)
        g, s = buffers.get(name, (0, 0))
        policies[name] = PolicyStatus(
            trainable=pc.trainable,
            latest_version=wv.version if wv else None,
            weight_location=wv.location if wv else None,
            steps=steps.get(name, 0),
            max_steps=recipe.run.max_steps,
            buffer_groups=g,
            buffer_samples=s or 0,
            unacked_batches=unacked.get(name, 0),
            staleness=hist.get(name, {}),
            dropped=drops.get(name, {}),
            counters=counters.get(name, {}),
        )
    exhausted = ctx.feeder.exhausted(tx)
    total_recent = sum(recent.values())
    return DataflowStatus(
        run=recipe.run.name,
        mode=recipe.run.mode,
        time=now,
        done=nodes_done(ctx, tx),
        training_done=state.training_done(tx, cfg, exhausted),
        round=ctx.mode.round(tx),
        queue=queue,
        in_flight_leases=lease_counts.get("active", 0),
        expired_leases=lease_counts.get("expired", 0),
        tasks_done=storage.tasks.done_training_count(tx),
        episodes=storage.episodes.count(tx),
        episodes_per_s=total_recent / THROUGHPUT_WINDOW_S,
        nodes=nodes,
        policies=policies,
        evaluations=evaluations.list_all(tx),
        dataflow_policies=ctx.pipeline.describe(),
    )
