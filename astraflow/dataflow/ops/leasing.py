"""Task leases: granting (with admission control, then the run mode's gate: see :mod:`.modes`),
renewal, expiry, release.

A lease hands one task (all ``group_size`` episodes of it) to one node until a deadline. Heartbeats
extend the deadlines of the node's leases; a lease past its deadline returns its task to the queue
so another node can run it. The first lease to deliver the whole group wins the task (see
:mod:`astraflow.dataflow.ops.ingest`), so a partitioned node that comes back late never duplicates
data.
"""

from __future__ import annotations

import json
import logging

from astraflow.dataflow import storage
from astraflow.dataflow.errors import DataflowError, Invalid, NotFound
from astraflow.dataflow.ops import adaptive, state
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.ops.task_feeder import load_task
from astraflow.dataflow.storage.store import Tx
from astraflow.dataflow.storage.tasks import EvalCandidate, TaskCandidate
from astraflow.protocol import (
    HeartbeatReply,
    Lease,
    LeaseGrant,
    LeaseRelease,
    LeaseRequest,
    new_id,
)
from astraflow.protocol.messages import NODE_METRIC_KEYS, Heartbeat

log = logging.getLogger(__name__)

#: A node's count of heartbeat metric keys dropped (not in NODE_METRIC_KEYS).
DROPPED_METRIC_KEYS = "dropped_metric_keys"
#: Counters the service keeps in a node's metrics (a heartbeat does not overwrite them).
INVALID_SAMPLES = "invalid_samples"  # samples a trainer quarantined (ops.batching)
SERVICE_NODE_COUNTERS = (DROPPED_METRIC_KEYS, INVALID_SAMPLES)

#: A lease request without ``max_episodes`` is bounded by ``max_tasks`` alone.
UNBOUNDED_EPISODES = 1 << 30

#: Most pending training tasks considered per lease request (the window keeps it far smaller).
MAX_CANDIDATES = 20_000


#: ``dataflow.lease_progress_s`` by default, in lease timeouts (see :func:`progress_bound`).
PROGRESS_TIMEOUTS = 5.0

#: The default per-node lease quota is never below this (see :func:`lease_quota`).
DEFAULT_QUOTA_FLOOR = 64

#: store meta key prefix of a throttled node (value: JSON ``{"until", "lease", "idle_s"}``)
THROTTLE_KEY = "lease_throttle/"


def progress_bound(ctx: Context) -> float:
    """Longest a lease may go without progress (``dataflow.lease_progress_s``; None:
    :data:`PROGRESS_TIMEOUTS` x ``lease_timeout_s``, 600 s by default: a whole group without a
    save may take that long on an honest node).

    Why: heartbeats renew every lease of a node, so a node that heartbeats but never pushes or
    saves held its tasks forever (issue 48, finding 4: a run froze past the lease timeout). The
    deadline a heartbeat sets is capped at this long after the lease's last push or accepted save
    (:func:`storage.leases.progress_at`)."""
    df = ctx.config.recipe.dataflow
    bound = getattr(df, "lease_progress_s", None)
    return float(bound) if bound is not None else PROGRESS_TIMEOUTS * ctx.config.lease_timeout_s


def lease_quota(ctx: Context) -> int:
    """Most active training leases one node may hold (``dataflow.max_leases_per_node``; None:
    twice the groups a node of the recipe's ``rollout.concurrency`` runs at once, at least
    :data:`DEFAULT_QUOTA_FLOOR`). Why: a node asking for 4,096 tasks took the whole task window,
    and one that sat on them starved the pool. The floor keeps nodes that join with more
    concurrency than the recipe's own from being held back by default."""
    recipe = ctx.config.recipe
    quota = getattr(recipe.dataflow, "max_leases_per_node", None)
    if quota is not None:
        return int(quota)
    group = max(1, recipe.tasks.group_size)
    return max(DEFAULT_QUOTA_FLOOR, 2 * -(-recipe.rollout.concurrency // group))


def throttled(ctx: Context, tx: Tx, node_id: str) -> str | None:
    """Why ``node_id`` gets no training lease now (None: it may): one of its leases expired
    without progress (:func:`expire_overdue`) less than :func:`progress_bound` ago."""
    raw = tx.get_meta(THROTTLE_KEY + node_id)
    if raw is None:
        return None
    try:
        info = json.loads(raw)
        until = float(info["until"])
    except (ValueError, KeyError, TypeError):
        tx.delete_meta(THROTTLE_KEY + node_id)
        return None
    now = ctx.now()
    if now >= until:
        tx.delete_meta(THROTTLE_KEY + node_id)
        return None
    return (
        f"node throttled for {until - now:.0f}s more: its lease {info.get('lease')!r} made no "
        f"progress (no push, no accepted save) for {float(info.get('idle_s', 0)):.0f}s, past "
        f"dataflow.lease_progress_s = {progress_bound(ctx):g}s, and was returned to the queue"
    )


def expire_overdue(ctx: Context, tx: Tx) -> int:
    """Expire active leases past their deadline and put their unfinished tasks back.

    A lease that expired because it made no progress for :func:`progress_bound` (its node may
    well still heartbeat) also throttles its node for that long: a node that hoards leases gets
    no new training work until the bound has passed again."""
    now = ctx.now()
    rows = storage.leases.overdue(tx, now)
    if not rows:
        return 0
    storage.leases.expire(tx, [r.id for r in rows])
    bound = progress_bound(ctx)
    for r in rows:
        idle = now - r.progress_at
        if idle >= bound:
            info = {"until": now + bound, "lease": r.id, "idle_s": round(idle, 3)}
            tx.set_meta(THROTTLE_KEY + r.node_id, json.dumps(info))
            log.warning(
                "lease %s of node %s made no progress for %.0fs (dataflow.lease_progress_s "
                "%gs): task %s back in the queue, node throttled for %gs",
                r.id,
                r.node_id,
                idle,
                bound,
                r.task_id,
                bound,
            )
    for task_id in {r.task_id for r in rows}:
        requeue_if_orphaned(tx, task_id)
    ctx.wake_after_commit(tx)
    return len(rows)


def requeue_if_orphaned(tx: Tx, task_id: str) -> None:
    if not storage.leases.active_count_of_task(tx, task_id):
        storage.tasks.requeue(tx, task_id)


def nodes_done(ctx: Context, tx: Tx) -> bool:
    """Nodes may leave: training is over, no evaluation is outstanding, grace period passed; or
    at once, when an admin stopped the run (nodes then finish or hand back what they hold)."""
    if state.stopped(tx) is not None:
        return True
    exhausted = ctx.feeder.exhausted(tx)
    if not state.training_done(tx, ctx.config, exhausted):
        return False
    since = state.mark_done_time(tx, ctx.now())
    if state.outstanding_evals(tx):
        return False
    return ctx.now() - since >= ctx.config.done_grace_s


def touch_node(ctx: Context, tx: Tx, node_id: str, versions: dict[str, int] | None) -> None:
    """Check that the node is registered and active, and record that it is alive.

    Re-attempts of a parked lease request only check (:func:`check_node`): the request already
    touched the node when it arrived (heartbeats keep it alive meanwhile), and a read-only attempt
    commits without writing to the WAL."""
    check_node(node_id, storage.nodes.state(tx, node_id))
    storage.nodes.touch(tx, node_id, ctx.now(), versions)


def check_node(node_id: str, node_state: str | None) -> None:
    """Raise unless a node in ``node_state`` ('active', 'left', None: never registered) may ask
    for work."""
    if node_state is None:
        raise NotFound(f"unknown node {node_id!r}; register with POST /nodes first", "node_id")
    if node_state != "active":
        raise NotFound(f"node {node_id!r} has deregistered; register again", "node_id")


def _admission(ctx: Context, req: LeaseRequest, latest: dict[str, int]) -> str | None:
    """Why this node may not start training tasks now (None if it may)."""
    needed = ctx.config.workflow_policies
    missing = [p for p in needed if p not in req.versions]
    if missing:
        return (
            f"node holds no weights for policies {missing}; the workflow's roles need "
            f"{needed} (report them in LeaseRequest.versions)"
        )
    lagging = []
    for p in needed:
        lag_bound = ctx.config.recipe.max_lag_for(p)
        if p in latest and req.versions[p] < latest[p] - lag_bound:
            lagging.append(
                f"{p}: node holds version {req.versions[p]}, latest is {latest[p]} "
                f"(max_lag {lag_bound})"
            )
    if lagging:
        return "admission control: weights too stale; update before leasing: " + "; ".join(lagging)
    rewound = [
        f"{p}: node holds version {req.versions[p]}, latest is {latest[p]}"
        for p in needed
        if p in latest and req.versions[p] > latest[p]
    ]
    if rewound:
        return (
            "the trainer restarted from a checkpoint and these versions no longer exist; load the "
            "latest before leasing: " + "; ".join(rewound)
        )
    return None


def _eval_candidates(tx: Tx, req: LeaseRequest, limit: int) -> list[EvalCandidate]:
    if not req.versions:
        return []
    rows = storage.tasks.pending_evaluations(tx, MAX_CANDIDATES)
    out = [r for r in rows if req.versions.get(r.eval_policy, -1) >= (r.min_version or 0)]
    return out[:limit]


def _training_candidates(
    ctx: Context, tx: Tx, want: int, round_: int | None
) -> list[TaskCandidate]:
    """Up to ``want`` pending training tasks in the task order, after the gates (predictive
    skipping, late deadlines) had their say; skipped tasks are replaced from the feeder."""
    order = ctx.pipeline.task_order
    chosen: list[TaskCandidate] = []
    # each pass skips at least one task or returns; the bound only stops a gate skipping everything
    for _ in range(64):
        need_now = want - len(chosen)
        if round_ is None:
            pending = storage.tasks.pending_training_count(tx)
            need = need_now + ctx.config.task_window
            if pending < need:
                ctx.feeder.enqueue(tx, need - pending)
            # in enqueue order the oldest ``want`` rows are the answer: the tasks chosen in earlier
            # passes come first, and skipped ones are no longer pending
            limit = want if order.enqueue_order else MAX_CANDIDATES
            rows = storage.tasks.pending_training(tx, limit)
        else:
            rows = storage.tasks.pending_training_of_round(tx, round_)
        taken = {r.id for r in chosen}
        rows = [r for r in rows if r.id not in taken]
        rows.sort(key=lambda r: order.sort_key(r.view()))
        kept, skipped = adaptive.skip_pending(ctx, tx, rows, need_now)
        chosen.extend(kept)
        if len(chosen) >= want or round_ is not None or not skipped:
            break
    return chosen[:want]


def grant(ctx: Context, tx: Tx, req: LeaseRequest) -> LeaseGrant:
    """One lease request, answered now (no waiting); raises the request's error."""
    (outcome,), _ = serve(ctx, tx, [req])
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def serve(
    ctx: Context, tx: Tx, reqs: list[LeaseRequest], *, touch: bool = True
) -> tuple[list[LeaseGrant | Exception], float | None]:
    """Answer lease requests in the given (FIFO) order within one transaction.

    Returns one outcome per request (a grant, possibly empty, or the request's error) and, when
    the run will be over after the done grace period with nothing else happening, the clock time
    at which that happens (so the service can wake parked requests then; nothing else signals it).

    Why one pass for many requests: the service parks empty-handed lease requests and re-serves
    them all together after each event that may have created work. One transaction (and one store
    round trip) per event then serves every waiting node, first come first served, instead of one
    transaction per waiting node per event (a thundering herd on the single writer thread).

    Why a pass's store work does not grow with the parked requests: work available to a request
    depends only on the versions it holds, so once one request with given versions comes back
    empty, later ones with the same versions get that same empty answer, and they are answered
    before anything of theirs is read (``touch=False``, the dispatcher's passes). Only the
    requests a pass actually tries have their stored reply and their node's state read: with
    thousands of parked nodes and one free task, a pass reads a handful of rows, not thousands
    (reading them all made every pass cost in proportion to the parked nodes, and heartbeats
    queued behind the passes on the writer; bench/dataflow_scale.py). What a skipped
    request would have learnt otherwise reaches it another way: a node that leaves has its parked
    request ended by the service at once (``DataflowService._end_parked``), and a retry granted
    leases in its own transaction hands them to the original parked beside it
    (``DataflowService._share_grant``).
    """
    expire_overdue(ctx, tx)
    latest = storage.versions.latest_versions(tx)
    locations, digests = storage.versions.weight_news(tx)
    done = nodes_done(ctx, tx)
    empty: dict[tuple, LeaseGrant] = {}
    outcomes: list[LeaseGrant | Exception] = []
    # Grants made in this pass, by scoped key: a retry parked beside its original (same key)
    # gets the same leases.
    granted: dict[str, bytes] = {}
    for req in reqs:
        idem = storage.idempotency.scoped("lease", req.node_id, req.idempotency_key)
        key = tuple(sorted(req.versions.items()))
        if not touch and not done and key in empty and not (idem and idem in granted):
            outcomes.append(empty[key])
            continue
        cached = granted.get(idem) if idem else None
        if cached is None and idem:
            cached = storage.idempotency.remembered(tx, idem, "lease")
        if cached is not None:
            outcomes.append(LeaseGrant.model_validate(state.unpack(cached)))
            continue
        try:
            if touch:
                touch_node(ctx, tx, req.node_id, req.versions)
            else:
                check_node(req.node_id, storage.nodes.state(tx, req.node_id))
        except DataflowError as exc:
            outcomes.append(exc)
            continue
        if done:
            outcomes.append(
                LeaseGrant(
                    latest_versions=latest,
                    weight_locations=locations,
                    weight_digests=digests,
                    done=True,
                    reason="run complete: every trainable policy reached run.max_steps",
                )
            )
            continue
        if key in empty:
            outcomes.append(empty[key])
            continue
        tx.savepoint("lease_request")
        try:
            reply = _attempt(ctx, tx, req, latest, locations, digests)
        except Exception as exc:  # this request's error; the others in the pass still run
            tx.rollback_to("lease_request")
            outcomes.append(exc)
            continue
        tx.release("lease_request")
        if reply.leases:
            packed = _remember(ctx, tx, idem, reply)
            if packed is not None:
                granted[idem] = packed
        else:
            empty[key] = reply
        outcomes.append(reply)
    return outcomes, None if done else done_at(ctx, tx)


def done_at(ctx: Context, tx: Tx) -> float | None:
    """When :func:`nodes_done` turns true by the clock alone (training over, no evaluation
    outstanding, only the grace period left), else None."""
    at = tx.get_meta("training_done_at")
    if at is None or state.outstanding_evals(tx):
        return None
    if not state.training_done(tx, ctx.config, ctx.feeder.exhausted(tx)):
        return None
    return float(at) + ctx.config.done_grace_s


def _fitting(rows: list[TaskCandidate], slots: int) -> list[TaskCandidate]:
    """The leading candidate tasks whose groups fit ``slots`` episodes."""
    out = []
    for row in rows:
        if row.group_size > slots:
            break
        slots -= row.group_size
        out.append(row)
    return out


def _attempt(
    ctx: Context,
    tx: Tx,
    req: LeaseRequest,
    latest: dict[str, int],
    locations: dict[str, str],
    digests: dict[str, str],
) -> LeaseGrant:
    """Grant what this request may take now (admission control, then the run mode's gate)."""
    now = ctx.now()
    reply = LeaseGrant(latest_versions=latest, weight_locations=locations, weight_digests=digests)
    # The node's free episode slots bound the grant's episodes (an evaluation task is one
    # episode, a training task group_size of them): rollout.concurrency counts episodes.
    slots = req.max_episodes if req.max_episodes is not None else UNBOUNDED_EPISODES
    chosen = list(_eval_candidates(tx, req, min(req.max_tasks, slots)))
    n_eval = len(chosen)
    slots -= n_eval
    remaining = min(req.max_tasks - len(chosen), slots // ctx.config.recipe.tasks.group_size)
    reason = None
    exhausted = ctx.feeder.exhausted(tx)
    if remaining > 0 and not state.training_done(tx, ctx.config, exhausted):
        reason = throttled(ctx, tx, req.node_id)
        if reason is None:
            held = storage.leases.active_training_of_node(tx, req.node_id)
            quota = lease_quota(ctx)
            remaining = min(remaining, quota - held)
            if remaining <= 0:
                reason = (
                    f"node holds {held} active training lease(s), the most one node may hold "
                    f"(dataflow.max_leases_per_node = {quota}); push or release them first"
                )
        if reason is None:
            reason = _admission(ctx, req, latest)
        if reason is None:
            gate = ctx.mode.training_gate(tx, req)
            reason = gate.reason
            remaining = min(remaining, gate.room)
            if reason is None and remaining > 0:
                chosen.extend(_fitting(_training_candidates(ctx, tx, remaining, gate.round), slots))
    for i, row in enumerate(chosen):
        task = load_task(row.body)
        lease = Lease(
            id=new_id("lease"),
            task=task,
            node_id=req.node_id,
            deadline=now + ctx.config.lease_timeout_s,
            issued_at=now,
            versions=dict(req.versions),
            # episodes an earlier lease saved in flight (ops.resuming): resumed, not replayed
            partials=storage.partials.of_task(tx, task.id),
        )
        storage.leases.insert(
            tx, lease.id, task.id, req.node_id, now, lease.deadline, req.versions, i < n_eval
        )
        storage.tasks.mark_leased(tx, task.id)
        reply.leases.append(lease)
    if len(reply.leases) < req.max_tasks and reason is None:
        exhausted = ctx.feeder.exhausted(tx)
        if state.training_done(tx, ctx.config, exhausted):
            reason = "training is complete; only evaluation tasks remain"
        elif exhausted:
            reason = "all task sets are exhausted; waiting for in-flight tasks"
        else:
            reason = ctx.mode.idle_reason(tx)
    reply.reason = reason
    return reply


def _remember(ctx: Context, tx: Tx, key: str | None, reply: LeaseGrant) -> bytes | None:
    """Keep a grant that handed out leases, so a retry (same key) gets the same leases; returns
    the stored reply (None without a key).

    Empty replies are not kept: recomputing one hands out nothing twice, and a parked request's
    re-attempts must not be answered from an earlier empty attempt."""
    if not key:
        return None
    packed = state.pack(reply.model_dump(mode="json"))
    storage.idempotency.remember(tx, key, "lease", packed, ctx.now())
    return packed


def heartbeat(ctx: Context, tx: Tx, node_id: str, hb: Heartbeat) -> HeartbeatReply:
    check_node(node_id, storage.nodes.state(tx, node_id))
    _record_beat(tx, node_id, ctx.now(), hb)
    expire_overdue(ctx, tx)
    now = ctx.now()
    renewed = storage.leases.active_of_node(tx, node_id)
    storage.leases.extend_node(tx, node_id, now + ctx.config.lease_timeout_s, progress_bound(ctx))
    lost = []
    for lease_id in hb.in_flight:
        held = storage.leases.with_task_state(tx, lease_id, node_id)
        if held is None or held.lease_state in ("superseded", "released"):
            lost.append(lease_id)
        elif held.task_state == "done" and held.winner != lease_id:
            lost.append(lease_id)
    locations, digests = storage.versions.weight_news(tx)
    return HeartbeatReply(
        latest_versions=storage.versions.latest_versions(tx),
        renewed=renewed,
        lost=lost,
        weight_locations=locations,
        weight_digests=digests,
        stop=nodes_done(ctx, tx),
        heartbeat_interval_s=ctx.heartbeat_s or ctx.config.heartbeat_interval_s,
    )


def node_news(ctx: Context, tx: Tx, reply: HeartbeatReply) -> tuple[HeartbeatReply, bool]:
    """What ``reply`` tells every node alike (versions, where their weights are, whether to stop),
    for heartbeats answered without a transaction (``DataflowService.heartbeat``), and whether
    only an announcement, an ack or a stop can change it: while training is not done (then the
    done grace period, the last evaluations or, in a run without trainers, the last pushes decide
    when nodes stop, and every heartbeat reads it afresh)."""
    news = HeartbeatReply(
        latest_versions=reply.latest_versions,
        weight_locations=reply.weight_locations,
        weight_digests=reply.weight_digests,
        stop=reply.stop,
    )
    settled = (
        bool(ctx.config.trainable)
        and not reply.stop
        and not state.training_done(tx, ctx.config, ctx.feeder.exhausted(tx))
    )
    return news, settled


def record_liveness(ctx: Context, tx: Tx, beats: dict[str, Heartbeat], at: dict[str, float]) -> int:
    """Persist heartbeats answered without a transaction: each node's last sign of life, the
    versions it holds and its metrics (nodes that left meanwhile are left alone); returns how
    many nodes were updated."""
    live = storage.nodes.states(tx, list(beats))
    n = 0
    for node_id, hb in beats.items():
        if live.get(node_id) != "active":
            continue
        _record_beat(tx, node_id, at[node_id], hb)
        n += 1
    return n


def _record_beat(tx: Tx, node_id: str, at: float, hb: Heartbeat) -> None:
    """One heartbeat's sign of life: when, the versions the node holds, its kept metrics."""
    storage.nodes.touch(tx, node_id, at, hb.versions)
    if hb.metrics:
        storage.nodes.set_metrics(tx, node_id, kept_metrics(tx, node_id, hb.metrics))


def kept_metrics(tx: Tx, node_id: str, metrics: dict[str, float]) -> dict[str, float]:
    """The documented node metrics (``NODE_METRIC_KEYS``) of a heartbeat; every other key is
    dropped and counted in the node's own ``dropped_metric_keys`` (shown in /status)."""
    kept = {k: v for k, v in metrics.items() if k in NODE_METRIC_KEYS}
    dropped = len(metrics) - len(kept)
    before = storage.nodes.metrics_of(tx, node_id)
    kept.update({k: before[k] for k in SERVICE_NODE_COUNTERS if k in before})
    if dropped:
        kept[DROPPED_METRIC_KEYS] = before.get(DROPPED_METRIC_KEYS, 0.0) + dropped
    return kept


def release(ctx: Context, tx: Tx, req: LeaseRelease) -> int:
    """Give leases back (a node shutting down or shedding load); returns how many were active."""
    touch_node(ctx, tx, req.node_id, None)
    for lease_id in req.lease_ids:
        lease = storage.leases.get(tx, lease_id)
        if lease is None:
            raise NotFound(f"unknown lease {lease_id!r}", "lease_ids")
        if lease.node_id != req.node_id:
            raise Invalid(f"lease {lease_id!r} belongs to another node", "lease_ids")
    return _take_back(ctx, tx, req.node_id, req.lease_ids)


def return_grant(ctx: Context, tx: Tx, req: LeaseRequest, lease_ids: list[str]) -> int:
    """Take back what a lease request was granted when its client hung up before the answer:
    its still-active leases go back to the queue, and its idempotency key is forgotten so that a
    retry with that key is served afresh instead of being handed the released leases."""
    storage.idempotency.forget(tx, req.idempotency_key)
    return _take_back(ctx, tx, req.node_id, lease_ids)


def _take_back(ctx: Context, tx: Tx, node_id: str, lease_ids: list[str]) -> int:
    """Release ``node_id``'s still-active leases among ``lease_ids`` (others are left alone),
    requeue their tasks and wake the parked requests; returns how many were released."""
    released = 0
    for lease_id in lease_ids:
        lease = storage.leases.get(tx, lease_id)
        if lease is not None and lease.node_id == node_id and lease.state == "active":
            storage.leases.mark_released(tx, lease_id)
            requeue_if_orphaned(tx, lease.task_id)
            released += 1
    if released:
        ctx.wake_after_commit(tx)
    return released


def release_node(ctx: Context, tx: Tx, node_id: str) -> int:
    lease_ids = storage.leases.active_of_node(tx, node_id)
    return release(ctx, tx, LeaseRelease(node_id=node_id, lease_ids=lease_ids))
