"""GET /status: builds the status document (its types live in ``astraflow.protocol.status``)."""

from __future__ import annotations

import json

from astraflow.dataflow import storage
from astraflow.dataflow.ops import evaluating, state
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.ops.ingest import error_reason
from astraflow.dataflow.ops.leasing import nodes_done
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol.status import (
    DataflowStatus,
    ErrorSummary,
    NodeStatus,
    NodeSummary,
    PolicyStatus,
    RegionNodes,
)

#: Window for node throughput (episodes per second over the last minute).
THROUGHPUT_WINDOW_S = 60.0
#: Window of a trainer's idle fraction: short enough that the autoscaler sees a change of load
#: within a few of its intervals, long enough to span several optimizer steps.
TRAINER_IDLE_WINDOW_S = 30.0


def trainer_idle(tx: Tx, policy: str, now: float) -> float | None:
    """The fraction of the last :data:`TRAINER_IDLE_WINDOW_S` in which ``policy``'s trainer had no
    batch: the time between an ack and the next batch served, which is the trainer waiting for
    data (served to acked is its own step). The window starts at the first batch at the earliest,
    so model loading is not counted as waiting. The union of the intervals counts a batch served
    while another trains once."""
    first = storage.batches.first_served(tx, policy)
    if first is None:
        return None
    start = max(first, now - TRAINER_IDLE_WINDOW_S)
    span = now - start
    if span <= 0:
        return None
    busy, reach = 0.0, start
    for served, acked in sorted(storage.batches.busy_since(tx, policy, start)):
        lo, hi = max(served, reach), min(now if acked is None else acked, now)
        if hi > lo:
            busy += hi - lo
            reach = hi
    return round(max(0.0, 1.0 - busy / span), 4)


#: Most active nodes /status lists (silent ones first); ``node_summary`` counts every node. At
#: 4,096 nodes the whole list was a megabyte built on the store's writer thread, holding every
#: heartbeat, lease and push behind each status read for seconds (bench/dataflow_scale.py).
STATUS_NODES_LISTED = 256


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
    silent_before = now - cfg.lease_timeout_s
    listed = storage.nodes.listed_rows(tx, silent_before, STATUS_NODES_LISTED)
    for nid, body, versions, n_state, last_hb, episodes, metrics in listed:
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
    regions, left, left_episodes = storage.nodes.summary(tx, silent_before)
    node_summary = NodeSummary(
        active=sum(r.active for r in regions),
        silent=sum(r.silent for r in regions),
        left=left,
        listed=len(nodes),
        episodes=sum(r.episodes for r in regions) + left_episodes,
        episodes_per_s=sum(recent.values()) / THROUGHPUT_WINDOW_S,
        active_leases=sum(active.values()),
        regions={
            r.region: RegionNodes(active=r.active, silent=r.silent, episodes=r.episodes)
            for r in regions
        },  # fmt: skip
    )
    latest = storage.versions.latest_weights(tx)
    steps = storage.batches.steps(tx)
    drops = storage.tallies.drops.by_policy(tx)
    filtered: dict[str, dict[str, int]] = {}
    for f in storage.groups.filtered_rewards(tx):
        filtered.setdefault(f.policy, {})[f"{f.reward:g}"] = f.groups
    errors: dict[str, ErrorSummary] = {}
    for e in storage.episodes.errors_by_reason(tx):
        key = error_reason(e.finish_reason)
        prev = errors.get(key)
        errors[key] = ErrorSummary(
            count=e.count + (prev.count if prev else 0),
            first=prev.first if prev else e.first_error,
            last=e.last_error,
        )
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
            filtered_rewards=filtered.get(name, {}),
            trainer_idle=(
                trainer_idle(tx, name, now)
                if pc.trainable and steps.get(name, 0) < recipe.run.max_steps
                else None
            ),
            cap_groups=ctx.mode.admission(name).get("cap_groups") if pc.trainable else None,
        )
    exhausted = ctx.feeder.exhausted(tx)
    total_recent = sum(recent.values())
    return DataflowStatus(
        run=recipe.run.name,
        mode=recipe.run.mode,
        time=now,
        done=nodes_done(ctx, tx),
        training_done=state.training_done(tx, cfg, exhausted),
        stopped=state.stopped(tx),
        round=ctx.mode.round(tx),
        queue=queue,
        in_flight_leases=lease_counts.get("active", 0),
        training_in_flight=storage.leases.in_flight_training(tx),
        expired_leases=lease_counts.get("expired", 0),
        saved_episodes=storage.partials.count(tx),
        tasks_done=storage.tasks.done_training_count(tx),
        episodes=storage.episodes.count(tx),
        episodes_per_s=total_recent / THROUGHPUT_WINDOW_S,
        nodes=nodes,
        node_summary=node_summary,
        policies=policies,
        evaluations=evaluating.list_all(tx),
        dataflow_policies=ctx.pipeline.describe(),
        errors=errors,
    )
