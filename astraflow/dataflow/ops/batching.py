"""Batches: choosing groups for a trainer, advantages, redelivery, acknowledgement.

Advantages (:mod:`astraflow.protocol.advantages`) are computed at batch time from the group
statistics stored at ingestion, following the policy's ``trainer.scale_rewards``. Doing it at batch
time keeps ingestion independent of trainer settings and lets batch-level scaling see the batch.
Samples that a batching policy drops do not change their group's baseline.

A served batch stays "served" until acknowledged; any request for the same policy gets the oldest
unacknowledged batch again first (a restarted trainer resumes where it died). Trainers therefore
acknowledge a batch before asking for the next one.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter

from astraflow.dataflow import storage
from astraflow.dataflow.errors import Invalid, NotFound
from astraflow.dataflow.ops import replay_pool, state, timeline
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.ops.leasing import INVALID_SAMPLES
from astraflow.dataflow.ops.modes import BatchPlan
from astraflow.dataflow.storage.groups import GroupRow
from astraflow.dataflow.storage.packed import unstore
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol import Ack, BatchAck, BatchRequest, new_id
from astraflow.protocol.advantages import advantages, reward_std


def _check_policy(ctx: Context, policy: str) -> None:
    recipe = ctx.config.recipe
    if policy not in recipe.policies:
        raise Invalid(
            f"unknown policy {policy!r}; recipe policies: {sorted(recipe.policies)}", "policy"
        )
    if not recipe.policies[policy].trainable:
        raise Invalid(
            f"policy {policy!r} is frozen (trainable = false); it has no buffer", "policy"
        )


#: A batch served this many times without an acknowledgement (its trainer died on it twice) is
#: quarantined instead of served again, so a restarted trainer always makes progress.
QUARANTINE_AFTER_SERVES = 2


def quarantine_batch(ctx: Context, tx: Tx, policy: str, batch_id: str) -> None:
    """Set a batch aside: never served again, not a step; its samples stay stored for a look,
    counted as dropped ``quarantined_batch``, and the nodes that sent them are named in
    metrics.jsonl (a ``quarantine`` record)."""
    now = ctx.now()
    storage.batches.mark_skipped(tx, batch_id, now)
    nodes = storage.samples.nodes_of_batch(tx, batch_id)
    n = sum(nodes.values())
    storage.tallies.drops.add(tx, policy, "quarantined_batch", n)
    ctx.metrics.record(
        tx,
        {
            "type": "quarantine",
            "policy": policy,
            "batch_id": batch_id,
            "reason": f"the trainer failed on this batch {QUARANTINE_AFTER_SERVES} times",
            "samples": n,
            "nodes": nodes,
            "time": now,
        },
    )


def quarantine_samples(
    ctx: Context, tx: Tx, policy: str, batch_id: str, invalid: dict[str, str]
) -> None:
    """Record the samples a trainer refused (id -> why): counted as dropped ``invalid_sample``,
    each node that sent one named, and the reasons kept in metrics.jsonl."""
    known = storage.samples.nodes_of_samples(tx, batch_id, list(invalid))
    storage.tallies.drops.add(tx, policy, "invalid_sample", len(known))
    per_node: Counter = Counter(by.node_id for by in known.values())
    for node, count in per_node.items():
        storage.nodes.add_counter(tx, node, INVALID_SAMPLES, count)
    ctx.metrics.record(
        tx,
        {
            "type": "quarantine",
            "policy": policy,
            "batch_id": batch_id,
            "reason": "invalid_sample",
            "samples": {sid: {"node": by.label, "why": invalid[sid]} for sid, by in known.items()},
            "time": ctx.now(),
        },
    )


def no_more_data(ctx: Context, tx: Tx) -> bool:
    return ctx.feeder.exhausted(tx) and state.outstanding_training_tasks(tx) == 0


def next_batch(ctx: Context, tx: Tx, req: BatchRequest) -> dict | None:
    """A BatchReply as a wire dict (packed arrays), or None when the caller should wait."""
    _check_policy(ctx, req.policy)
    stopped = state.stopped(tx)
    if stopped is not None:  # the trainer checkpoints and leaves
        return reply(done=True, reason=f"the run was stopped: {stopped}")
    served = storage.batches.oldest_served(tx, req.policy)
    while served is not None and (
        storage.batches.times_served(tx, served) >= QUARANTINE_AFTER_SERVES
    ):
        quarantine_batch(ctx, tx, req.policy, served)
        served = storage.batches.oldest_served(tx, req.policy)
    if served is not None:
        storage.batches.count_redelivery(tx, served)
        return reply(batch=assemble(tx, served), redelivered=True)
    done_steps = storage.batches.steps(tx).get(req.policy, 0)
    if done_steps >= ctx.config.recipe.run.max_steps:
        return reply(done=True, reason=f"policy {req.policy!r} reached run.max_steps")
    plan = ctx.mode.batch_plan(tx, req, ctx.feeder.exhausted(tx))
    if plan.done_reason is not None:
        return reply(done=True, reason=plan.done_reason)
    if plan.wait:
        return None
    return _form_batch(ctx, tx, req, plan)


def reply(
    batch: dict | None = None,
    *,
    reason: str | None = None,
    done: bool = False,
    redelivered: bool = False,
) -> dict:
    return {"batch": batch, "reason": reason, "done": done, "redelivered": redelivered}


def _ready_groups(ctx: Context, tx: Tx, policy: str, round_: int | None = None) -> list[GroupRow]:
    rows = storage.groups.ready(tx, policy, round_)
    order = ctx.pipeline.group_order
    rows.sort(key=lambda g: order.sort_key(g.view(policy)))
    return rows


def _filter_group(ctx: Context, tx: Tx, group_id: str, trainer_version: int):
    kept, dropped = [], Counter()
    for view in storage.samples.views_of_group(tx, group_id):
        reason = None
        for f in ctx.pipeline.sample_filters:
            reason = f.apply(view, trainer_version)
            if reason:
                break
        if reason:
            dropped[reason] += 1
        else:
            kept.append(view)
    return kept, dropped


def _drop_group(tx: Tx, policy: str, group_id: str, g_dropped: Counter, dropped: Counter) -> None:
    """Every sample of the group is dropped for good (staleness only grows): final."""
    storage.groups.mark_dropped(tx, group_id)
    storage.samples.discard_token_arrays(tx, [group_id])
    for reason, n in g_dropped.items():
        storage.tallies.drops.add(tx, policy, reason, n)
    dropped.update(g_dropped)


def _form_batch(ctx: Context, tx: Tx, req: BatchRequest, plan: BatchPlan) -> dict | None:
    """The batch the run mode's plan asks for (and replays, if it allows them), or None while too
    few groups are ready."""
    chosen, dropped = [], Counter()
    replayed = []
    if plan.replays:
        replay = ctx.pipeline.replay
        slots = replay.slots(req.num_groups) if replay is not None else 0
        replayed = replay_pool.pool_candidates(ctx, tx, req.policy, req.trainer_version, slots)
    fresh = None if plan.num_groups is None else plan.num_groups - len(replayed)
    for g in _ready_groups(ctx, tx, req.policy, plan.round):
        kept, g_dropped = _filter_group(ctx, tx, g.id, req.trainer_version)
        if not kept:
            _drop_group(tx, req.policy, g.id, g_dropped, dropped)
            continue
        chosen.append((g, kept, g_dropped))
        if len(chosen) == fresh:
            break
    if fresh is not None and len(chosen) < fresh:
        if not no_more_data(ctx, tx):
            return None
        if not chosen:
            return reply(done=True, reason="task sets exhausted and every group consumed")
    for g in replayed:
        kept, g_dropped = _filter_group(ctx, tx, g.id, req.trainer_version)
        if kept:
            chosen.append((g, kept, g_dropped))
        else:  # a replay bound looser than the staleness bound: the copy is dropped, counted
            _drop_group(tx, req.policy, g.id, g_dropped, dropped)
    return _create_batch(ctx, tx, req, chosen, dropped, plan)


def _create_batch(
    ctx: Context, tx: Tx, req: BatchRequest, chosen: list, dropped: Counter, plan: BatchPlan
) -> dict:
    scale = ctx.config.recipe.policies[req.policy].trainer.scale_rewards
    all_rewards = [s.reward for _, kept, _ in chosen for s in kept]
    batch_std = reward_std(all_rewards)
    layout, staleness = [], Counter()
    for g, kept, g_dropped in chosen:
        for reason, n in g_dropped.items():
            storage.tallies.drops.add(tx, req.policy, reason, n)
        dropped.update(g_dropped)
        entries = []
        advs = advantages(
            [s.reward for s in kept],
            scale,
            baseline=(g.reward_mean, g.reward_std),
            batch_std=batch_std,
        )
        for s, adv in zip(kept, advs, strict=True):
            entries.append([s.id, adv, s.weight])
            staleness[s.staleness(req.trainer_version)] += 1
        layout.append([g.id, entries])
    batch_id = new_id("batch")
    n = len(all_rewards)
    n_replayed = sum(len(kept) for g, kept, _ in chosen if replay_pool.is_replay(g.id))
    summary = {
        "replayed": n_replayed,
        "samples": n,
        "groups": len(chosen),
        "reward_mean": statistics.fmean(all_rewards) if all_rewards else None,
        "staleness": {str(k): v for k, v in sorted(staleness.items())},
        "dropped": dict(dropped),
    }
    storage.batches.insert(
        tx,
        (
            batch_id,
            req.policy,
            req.trainer_id,
            req.trainer_version,
            plan.round,
            json.dumps(layout),
            json.dumps(summary),
            ctx.now(),
        ),
    )
    storage.groups.mark_batched(tx, [(batch_id, g.id) for g, _, _ in chosen])
    if n_replayed:
        storage.tallies.counters.add(tx, req.policy, "replayed_samples", n_replayed)
        storage.tallies.counters.add(
            tx,
            req.policy,
            "replayed_groups",
            sum(replay_pool.is_replay(g.id) for g, _, _ in chosen),
        )
    if plan.replays and ctx.pipeline.replay is not None:
        pooled = replay_pool.admit(ctx, tx, req.policy, [g.id for g, _, _ in chosen])
        storage.tallies.counters.add(tx, req.policy, "replay_pooled_groups", pooled)
    return reply(batch=assemble(tx, batch_id))


def assemble(tx: Tx, batch_id: str) -> dict:
    """The stored batch as a wire dict: the same groups, samples, advantages and weights as when
    it was first served (token arrays stay the packed bytes they were stored as)."""
    policy, trainer_version, layout, summary = storage.batches.for_assembly(tx, batch_id)
    layout = json.loads(layout)
    group_rows = storage.groups.for_assembly(tx, [group_id for group_id, _ in layout])
    sample_rows = storage.samples.for_assembly(
        tx, [sid for _, entries in layout for sid, _, _ in entries]
    )
    groups = []
    for group_id, entries in layout:
        g = group_rows[group_id]
        samples = []
        for sid, adv, weight in entries:
            r = sample_rows[sid]
            tokens, loss_mask, logprobs, versions = unstore(
                r.tokens, r.loss_mask, r.logprobs, r.versions
            )
            samples.append(
                {
                    "id": sid,
                    "policy": policy,
                    "role": r.role,
                    "task_id": r.task_id,
                    "episode_id": r.episode_id,
                    "group_id": group_id,
                    "tokens": tokens,
                    "loss_mask": loss_mask,
                    "logprobs": logprobs,
                    "versions": versions,
                    "reward": r.reward,
                    "advantage": adv,
                    "weight": weight,
                    "turn_rewards": None if r.turn_rewards is None else json.loads(r.turn_rewards),
                }
            )
        groups.append(
            {
                "id": group_id,
                "task_id": g.task_id,
                "policy": policy,
                "task_set": g.task_set,
                "samples": samples,
                "reward_mean": g.reward_mean,
                "reward_std": g.reward_std,
            }
        )
    return {
        "id": batch_id,
        "policy": policy,
        "trainer_version": trainer_version,
        "groups": groups,
        "dropped": json.loads(summary)["dropped"],
    }


def ack(ctx: Context, tx: Tx, batch_id: str, req: BatchAck) -> Ack:
    key = storage.idempotency.scoped("ack", batch_id, req.idempotency_key)
    body_digest = storage.idempotency.digest(req.model_dump_json(exclude={"idempotency_key"}))
    cached = storage.idempotency.remembered(tx, key, "ack", body_digest)
    if cached is not None:
        return Ack.model_validate(state.unpack(cached))
    now = ctx.now()
    row = storage.batches.for_ack(tx, batch_id)
    if row is None:
        raise NotFound(f"unknown batch {batch_id!r}", "batch_id")
    policy, b_state, summary_json, served_at = row.policy, row.state, row.summary, row.created_at
    if req.invalid_samples and b_state == "served":
        quarantine_samples(ctx, tx, policy, batch_id, req.invalid_samples)
    if b_state in ("acked", "skipped"):
        result = Ack(ok=True, detail="batch was already acknowledged", at=now)
    elif b_state == "rewound":
        result = Ack(ok=True, detail="batch belongs to a rewound timeline; not a step", at=now)
    elif not req.trained:
        # consumed without an optimizer step (nothing trainable): done with, not a step
        storage.batches.mark_skipped(tx, batch_id, now)
        groups = storage.groups.ids_of_batch(tx, batch_id)
        storage.samples.discard_token_arrays(tx, groups)
        storage.tallies.drops.add(tx, policy, "untrainable_batch")
        result = Ack(ok=True, detail="batch consumed without a step", at=now)
    else:
        step = storage.batches.steps(tx).get(policy, 0) + 1
        storage.batches.mark_acked(tx, batch_id, now, step)
        timeline.on_ack(ctx, tx, policy, batch_id, req.checkpoint_version)
        summary = json.loads(summary_json)
        hist = {int(k): v for k, v in summary["staleness"].items()}
        storage.staleness.add(tx, [(policy, k, v) for k, v in hist.items()])
        n = sum(hist.values())
        ctx.mode.observe_step(policy, now - served_at)
        lag_mean = (sum(k * v for k, v in hist.items()) / n) if n else None
        ctx.metrics.record(
            tx,
            {
                "type": "step",
                "policy": policy,
                "step": step,
                "version": req.trainer_version,
                "batch_id": batch_id,
                "samples": summary["samples"],
                "groups": summary["groups"],
                "reward_mean": summary["reward_mean"],
                "staleness_mean": lag_mean,
                "staleness_max": max(hist) if hist else None,
                # versions between a sample's generation and this step, and what admission
                # allowed in flight meanwhile (steps of groups, the measured pace)
                "version_lag": {"mean": lag_mean, "max": max(hist) if hist else None},
                "admission": ctx.mode.admission(policy),
                "dropped": summary["dropped"],
                # every drop so far by reason (ingestion filters included), and the nodes'
                # throughput and weight-sync times: experiment trackers read them from here
                "drops_total": storage.tallies.drops.by_policy(tx).get(policy, {}),
                "nodes": storage.nodes.active_metrics(tx),
                "replayed": summary.get("replayed", 0),
                "metrics": req.metrics,
                "time": now,
            },
        )
        result = Ack(ok=True, detail=f"step {step} of {policy!r} recorded", at=now)
        ctx.advance_mode(tx)
    storage.idempotency.remember(tx, key, "ack", state.pack(result.model_dump()), now, body_digest)
    return result
