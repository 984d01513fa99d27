"""Batches: choosing groups for a trainer, advantages, redelivery, acknowledgement.

Advantages are computed at batch time from the group statistics stored at ingestion, following the
policy's ``trainer.scale_rewards``: ``group`` -> (r - mean) / (std + eps); ``batch`` -> (r - mean) /
(std of the batch's rewards + eps); ``none`` -> r - mean (eps = 1e-4 as in TRL). Doing it at batch
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

from astraflow.dataflow import replays, state, storage, timeline
from astraflow.dataflow.context import Context
from astraflow.dataflow.errors import Invalid, NotFound
from astraflow.dataflow.packed import unstore
from astraflow.dataflow.policies import GroupView, SampleView
from astraflow.dataflow.store import Tx
from astraflow.protocol import Ack, BatchAck, BatchRequest, new_id

ADV_EPS = 1e-4


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


def no_more_data(ctx: Context, tx: Tx) -> bool:
    return ctx.feeder.exhausted(tx) and state.outstanding_training_tasks(tx) == 0


def next_batch(ctx: Context, tx: Tx, req: BatchRequest) -> dict | None:
    """A BatchReply as a wire dict (packed arrays), or None when the caller should wait."""
    _check_policy(ctx, req.policy)
    row = storage.batches.oldest_served(tx, req.policy)
    if row is not None:
        storage.batches.count_redelivery(tx, row[0])
        return reply(batch=assemble(tx, row[0]), redelivered=True)
    done_steps = storage.batches.steps(tx).get(req.policy, 0)
    if done_steps >= ctx.config.recipe.run.max_steps:
        return reply(done=True, reason=f"policy {req.policy!r} reached run.max_steps")
    return ctx.mode.next_batch(ctx, tx, req)


def reply(
    batch: dict | None = None,
    *,
    reason: str | None = None,
    done: bool = False,
    redelivered: bool = False,
) -> dict:
    return {"batch": batch, "reason": reason, "done": done, "redelivered": redelivered}


def _ready_groups(ctx: Context, tx: Tx, policy: str, round_: int | None = None) -> list[tuple]:
    rows = storage.groups.ready(tx, policy, round_)
    order = ctx.pipeline.group_order
    rows.sort(
        key=lambda r: order.sort_key(
            GroupView(r[1], r[2], policy, r[3], [], r[0], r[6], r[4], r[5])
        )
    )
    return rows


def _filter_group(ctx: Context, tx: Tx, group_id: str, trainer_version: int):
    kept, dropped = [], Counter()
    for sid, reward, min_v in storage.samples.of_group(tx, group_id):
        view = SampleView(sid, group_id, reward, min_v)
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


def next_async_batch(ctx: Context, tx: Tx, req: BatchRequest) -> dict | None:
    """Async mode: the best ready groups (and replays), or None while too few are ready."""
    chosen, dropped = [], Counter()
    replay = ctx.pipeline.replay
    slots = replay.slots(req.num_groups) if replay is not None else 0
    replayed = replays.pool_candidates(ctx, tx, req.policy, req.trainer_version, slots)
    fresh = req.num_groups - len(replayed)
    for g in _ready_groups(ctx, tx, req.policy):
        kept, g_dropped = _filter_group(ctx, tx, g[1], req.trainer_version)
        if not kept:
            # Every sample of the group is dropped for good (staleness only grows): final.
            storage.groups.mark_dropped(tx, g[1])
            storage.samples.discard_token_arrays(tx, [g[1]])
            for reason, n in g_dropped.items():
                storage.tallies.drops.add(tx, req.policy, reason, n)
            dropped.update(g_dropped)
            continue
        chosen.append((g, kept, g_dropped))
        if len(chosen) == fresh:
            break
    if len(chosen) < fresh:
        if not no_more_data(ctx, tx):
            return None
        if not chosen:
            return reply(done=True, reason="task sets exhausted and every group consumed")
    for g in replayed:
        kept, g_dropped = _filter_group(ctx, tx, g[1], req.trainer_version)
        if kept:
            chosen.append((g, kept, g_dropped))
        else:  # a replay bound looser than the staleness bound: the copy is dropped, counted
            storage.groups.mark_dropped(tx, g[1])
            storage.samples.discard_token_arrays(tx, [g[1]])
            for reason, n in g_dropped.items():
                storage.tallies.drops.add(tx, req.policy, reason, n)
            dropped.update(g_dropped)
    return _create_batch(ctx, tx, req, chosen, dropped, None)


def round_acked(tx: Tx, policy: str, round_: int) -> bool:
    """Lock-step mode: ``policy`` acknowledged its batch of round ``round_``."""
    return bool(storage.batches.round_acked(tx, policy, round_))


def next_round_batch(ctx: Context, tx: Tx, req: BatchRequest, round_: int) -> dict | None:
    """Lock-step mode: exactly round ``round_``'s groups, once every task of it is done."""
    if round_acked(tx, req.policy, round_):
        return None  # waiting for the other policies and version announcements
    total, open_ = storage.tasks.round_progress(tx, round_)
    if total == 0:
        if ctx.feeder.exhausted(tx):
            return reply(done=True, reason="task sets exhausted")
        return None
    if open_:
        return None
    chosen, dropped = [], Counter()
    for g in _ready_groups(ctx, tx, req.policy, round_):
        kept, g_dropped = _filter_group(ctx, tx, g[1], req.trainer_version)
        if not kept:
            storage.groups.mark_dropped(tx, g[1])
            storage.samples.discard_token_arrays(tx, [g[1]])
            for reason, n in g_dropped.items():
                storage.tallies.drops.add(tx, req.policy, reason, n)
            dropped.update(g_dropped)
            continue
        chosen.append((g, kept, g_dropped))
    return _create_batch(ctx, tx, req, chosen, dropped, round_)


def _create_batch(ctx, tx, req, chosen, dropped: Counter, round_) -> dict:
    scale = ctx.config.recipe.policies[req.policy].trainer.scale_rewards
    all_rewards = [s.reward for _, kept, _ in chosen for s in kept]
    batch_std = statistics.stdev(all_rewards) if len(all_rewards) > 1 else 0.0
    layout, staleness = [], Counter()
    for g, kept, g_dropped in chosen:
        mean, std = g[7], g[8]
        for reason, n in g_dropped.items():
            storage.tallies.drops.add(tx, req.policy, reason, n)
        dropped.update(g_dropped)
        entries = []
        for s in kept:
            if scale == "group":
                adv = (s.reward - mean) / (std + ADV_EPS)
            elif scale == "batch":
                adv = (s.reward - mean) / (batch_std + ADV_EPS)
            else:
                adv = s.reward - mean
            entries.append([s.id, adv, s.weight])
            staleness[s.staleness(req.trainer_version)] += 1
        layout.append([g[1], entries])
    batch_id = new_id("batch")
    n = len(all_rewards)
    n_replayed = sum(len(kept) for g, kept, _ in chosen if replays.is_replay(g[1]))
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
            round_,
            json.dumps(layout),
            json.dumps(summary),
            ctx.now(),
        ),
    )
    storage.groups.mark_batched(tx, [(batch_id, g[1]) for g, _, _ in chosen])
    if n_replayed:
        storage.tallies.counters.add(tx, req.policy, "replayed_samples", n_replayed)
        storage.tallies.counters.add(
            tx, req.policy, "replayed_groups", sum(replays.is_replay(g[1]) for g, _, _ in chosen)
        )
    if round_ is None and ctx.pipeline.replay is not None:
        pooled = replays.admit(ctx, tx, req.policy, [g[1] for g, _, _ in chosen])
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
            tokens, loss_mask, logprobs, versions = unstore(r[3], r[4], r[5], r[6])
            samples.append(
                {
                    "id": sid,
                    "policy": policy,
                    "role": r[0],
                    "task_id": r[1],
                    "episode_id": r[2],
                    "group_id": group_id,
                    "tokens": tokens,
                    "loss_mask": loss_mask,
                    "logprobs": logprobs,
                    "versions": versions,
                    "reward": r[7],
                    "advantage": adv,
                    "weight": weight,
                }
            )
        groups.append(
            {
                "id": group_id,
                "task_id": g[0],
                "policy": policy,
                "task_set": g[1],
                "samples": samples,
                "reward_mean": g[2],
                "reward_std": g[3],
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
    cached = storage.idempotency.remembered(tx, req.idempotency_key, "ack")
    if cached is not None:
        return Ack.model_validate(state.unpack(cached))
    now = ctx.now()
    row = storage.batches.for_ack(tx, batch_id)
    if row is None:
        raise NotFound(f"unknown batch {batch_id!r}", "batch_id")
    policy, b_state, summary_json, round_ = row
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
                "staleness_mean": (sum(k * v for k, v in hist.items()) / n) if n else None,
                "staleness_max": max(hist) if hist else None,
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
        ctx.mode.advance(ctx, tx)
    storage.idempotency.remember(
        tx, req.idempotency_key, "ack", state.pack(result.model_dump()), now
    )
    return result
