"""Trajectory pushes: episodes become per-policy samples, samples of one task become groups.

Rules (documented in docs/decisions.md):

- A lease covers all ``group_size`` episodes of its task; a node may push them in one or several
  pushes. The lease whose episodes complete the group first wins the task; every other lease of the
  task is superseded and its partial samples are discarded (counted as ``superseded``). A push for
  a task that is already complete is rejected, so data is never taken twice.
- An episode with ``error`` is stored for the record, counts towards completing the lease, yields
  no sample and is counted as dropped (``episode_error``, or ``env_timeout`` when an env call ran
  past ``rollout.env_timeout_s``) for each trainable policy of the workflow. The group is formed from the remaining episodes (a smaller group), because re-running
  only the failed episodes would mix episodes from different attempts and versions.
- Each role trajectory becomes one sample of the role's policy; when one policy plays several
  roles, all its role samples join the same group. Frozen policies' samples are not buffered
  (counted as ``frozen_policy``). Evaluation episodes never become samples.
- Group reward mean and std (unbiased, as TRL computes it) are stored at ingestion; advantages are
  computed at batch time (see :mod:`astraflow.dataflow.batching`).
"""

from __future__ import annotations

import json
import statistics

from astraflow.dataflow import adaptive, state, storage
from astraflow.dataflow.context import Context
from astraflow.dataflow.evaluations import record_eval_episode
from astraflow.dataflow.packed import PackedArrays
from astraflow.dataflow.policies import GroupView
from astraflow.dataflow.store import Tx
from astraflow.protocol import Episode, PushResult, TrajectoryPush


def push(
    ctx: Context,
    tx: Tx,
    req: TrajectoryPush,
    packed: dict[tuple[int, int], PackedArrays] | None = None,
) -> PushResult:
    """Ingest ``req``; ``packed`` holds arrays that arrived packed (see :mod:`.packed`)."""
    packed = packed or {}
    cached = storage.idempotency.remembered(tx, req.idempotency_key, "push")
    if cached is not None:
        result = PushResult.model_validate(state.unpack(cached))
        result.duplicate = True
        return result
    now = ctx.now()

    def reject(reason: str) -> PushResult:
        result = PushResult(accepted=False, reason=reason)
        storage.idempotency.remember(
            tx, req.idempotency_key, "push", state.pack(result.model_dump()), now
        )
        return result

    row = storage.leases.for_push(tx, req.lease_id)
    if row is None:
        return reject(f"unknown lease {req.lease_id!r}")
    (task_id, lease_node, lease_state, lease_episodes), task = row[:4], row[4:]
    if lease_node != req.node_id:
        return reject(
            f"lease {req.lease_id!r} was granted to node {lease_node!r}, not {req.node_id!r}"
        )
    t_state, winner, group_size, is_eval, eval_id, eval_policy = task[:6]
    if t_state == "done":
        if winner == req.lease_id:
            return reject(f"lease {req.lease_id!r} already delivered its whole group")
        return reject(
            f"task {task_id!r} was already completed by another lease (first finisher wins)"
        )
    if lease_state in ("released", "superseded"):
        return reject(f"lease {req.lease_id!r} was {lease_state}")
    if not req.episodes:
        return reject("push carries no episodes")
    remaining = group_size - lease_episodes
    if len(req.episodes) > remaining:
        return reject(
            f"lease {req.lease_id!r} needs {remaining} more episode(s) (group_size {group_size}), "
            f"push has {len(req.episodes)}"
        )
    roles = ctx.config.roles
    seen: set[str] = set()
    pushed_before = storage.episodes.existing(tx, [ep.id for ep in req.episodes])
    for i, ep in enumerate(req.episodes):
        if ep.task_id != task_id:
            return reject(f"episodes[{i}].task_id is {ep.task_id!r}, lease is for {task_id!r}")
        unknown = {t.role for t in ep.trajectories} - set(roles)
        if unknown:
            return reject(
                f"episodes[{i}] has roles {sorted(unknown)} not in workflow.roles {sorted(roles)}"
            )
        if len({t.role for t in ep.trajectories}) != len(ep.trajectories):
            return reject(f"episodes[{i}] has two trajectories for one role")
        if ep.id in seen or ep.id in pushed_before:
            return reject(f"episodes[{i}].id {ep.id!r} was already pushed")
        seen.add(ep.id)

    n_samples = 0
    storage.episodes.insert_many(
        tx, [_episode_row(ep, req, bool(is_eval), now) for ep in req.episodes]
    )
    for i, ep in enumerate(req.episodes):
        if is_eval:
            record_eval_episode(ctx, tx, eval_id, eval_policy, ep)
        else:
            arrays = [
                packed.get((i, j))
                or PackedArrays.from_lists(t.tokens, t.loss_mask, t.logprobs, t.versions)
                for j, t in enumerate(ep.trajectories)
            ]
            n_samples += _insert_samples(ctx, tx, ep, req.lease_id, arrays)
    storage.leases.add_episodes(tx, req.lease_id, len(req.episodes))
    storage.nodes.add_episodes(tx, req.node_id, len(req.episodes))
    if lease_episodes + len(req.episodes) == group_size:
        _complete(ctx, tx, task_id, req.lease_id, task)
    result = PushResult(accepted=True, samples=n_samples)
    storage.idempotency.remember(
        tx, req.idempotency_key, "push", state.pack(result.model_dump()), now
    )
    return result


def _episode_row(ep: Episode, req: TrajectoryPush, is_eval: bool, now: float) -> tuple:
    return (
        ep.id,
        ep.task_id,
        req.lease_id,
        req.node_id,
        int(is_eval),
        ep.finish_reason,
        ep.error,
        json.dumps(ep.rewards),
        json.dumps({"info": ep.info, "metrics": ep.metrics}, default=str),
        now,
    )


def _insert_samples(
    ctx: Context, tx: Tx, ep: Episode, lease_id: str, arrays: list[PackedArrays]
) -> int:
    roles = ctx.config.roles
    if ep.error is not None:
        reason = "env_timeout" if ep.finish_reason == "env_timeout" else "episode_error"
        for policy in ctx.config.workflow_policies:
            if ctx.config.is_trainable(policy):
                storage.tallies.drops.add(tx, policy, reason)
        return 0
    rows = []
    for traj, a in zip(ep.trajectories, arrays, strict=True):
        policy = roles[traj.role]
        if not ctx.config.is_trainable(policy):
            storage.tallies.drops.add(tx, policy, "frozen_policy")
            continue
        rows.append(
            (
                f"{ep.id}/{traj.role}",
                ep.id,
                lease_id,
                ep.task_id,
                policy,
                group_id_of(ep.task_id, policy),
                traj.role,
                float(ep.rewards[traj.role]),
                a.min_version,
                a.max_version,
                a.n_tokens,
                *a.stored(),
            )
        )
    storage.samples.insert(tx, rows)
    return len(rows)


def group_id_of(task_id: str, policy: str) -> str:
    """The id of the group that a task's samples of ``policy`` form once the task completes.

    Samples carry it from their insertion: setting it at completion instead rewrote every sample
    row with its token arrays (SQLite rewrites a whole row on update), doubling the bytes written
    per push. Until the group exists no query reaches samples through it, and samples of leases
    that lose the task are deleted in the transaction that creates the group."""
    return f"{task_id}/{policy}"


def group_stats(rewards: list[float]) -> tuple[float, float]:
    """Mean and unbiased standard deviation (0 for a single sample), as TRL's GRPO computes them."""
    if not rewards:
        return 0.0, 0.0
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return mean, std


def _complete(ctx: Context, tx: Tx, task_id: str, lease_id: str, task: tuple) -> None:
    now = ctx.now()
    round_, task_set, priority, deadline = task[6:10]
    is_eval = bool(task[3])
    # a new group (or a dropped one: backpressure room), an evaluation task done: wake the long
    # polls. A push that completes nothing changes nothing they wait for and wakes nobody.
    ctx.wake_after_commit(tx)
    storage.tasks.finish(tx, task_id, lease_id, now)
    storage.leases.mark_finished(tx, lease_id)
    for loser in storage.leases.others_of_task(tx, task_id, lease_id):
        storage.leases.mark_superseded(tx, loser)
        for policy, n in storage.samples.counts_of_lease(tx, loser):
            storage.tallies.drops.add(tx, policy, "superseded", n)
        storage.samples.delete_of_lease(tx, loser)
    if is_eval:
        return
    by_policy: dict[str, list[tuple[str, float, int]]] = {}
    for sid, policy, reward, min_v in storage.samples.of_lease(tx, lease_id):
        by_policy.setdefault(policy, []).append((sid, reward, min_v))
    for policy, samples in by_policy.items():
        rewards = [s[1] for s in samples]
        mean, std = group_stats(rewards)
        gen_versions = [s[2] for s in samples if s[2] >= 0]
        group_id = group_id_of(task_id, policy)
        view = GroupView(
            id=group_id,
            task_id=task_id,
            policy=policy,
            task_set=task_set,
            rewards=rewards,
            min_version=min(gen_versions) if gen_versions else -1,
            priority=priority,
            deadline=deadline,
        )
        reason = None
        for f in ctx.pipeline.group_filters:
            reason = f.drop_reason(view)
            if reason:
                break
        if reason:
            storage.tallies.drops.add(tx, policy, reason, len(samples))
        storage.groups.insert(
            tx,
            (
                group_id,
                task_id,
                policy,
                task_set,
                round_,
                len(samples),
                mean,
                std,
                view.min_version,
                priority,
                deadline,
                "filtered" if reason else "ready",
                now,
            ),
        )
        if reason:
            storage.samples.discard_token_arrays(tx, [group_id])
        adaptive.observe(ctx, tx, view)
