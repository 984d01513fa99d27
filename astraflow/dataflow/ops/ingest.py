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
  computed at batch time (see :mod:`astraflow.dataflow.ops.batching`).
- A push refused for what conflicts with what the service issued (no episodes, too many,
  another task's, unknown or doubled roles, episode ids already pushed: ``accepted=false``) ends
  its lease: the task goes back to the queue at once, and the episodes saved in flight for the
  task are discarded (counted), since a lease that resumed them could not deliver them. Why
  (issue 48, finding 1): a refused push used to leave its lease active, renewed by every
  heartbeat, so a task whose saved episodes could never be pushed cycled on the honest node
  forever. Each refusal is counted in ``/status.refused`` (the service, from ``refused``).
  A push refused at the door (422: tokens outside the vocabulary, versions from the future)
  leaves its lease as it is, so a node may correct and resend; a lease that never gets a push
  through expires at ``dataflow.lease_progress_s`` (:mod:`.leasing`), a refused push being no
  progress.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from astraflow.dataflow import storage
from astraflow.dataflow.errors import Invalid
from astraflow.dataflow.ops import adaptive, state
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.ops.evaluating import record_eval_episode
from astraflow.dataflow.policies import GroupView
from astraflow.dataflow.storage.groups import NewGroup
from astraflow.dataflow.storage.leases import PushTarget
from astraflow.dataflow.storage.packed import PackedArrays
from astraflow.dataflow.storage.samples import LeaseSample
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol import Episode, PushResult, TrajectoryPush
from astraflow.protocol.advantages import reward_stats


def future_version(
    claimed: int | None, policy: str, latest: dict[str, int], field: str
) -> Invalid | None:
    """The 422 for tokens claiming weight version ``claimed``, newer than the newest ``policy``
    version the service announced (None: fine, no tokens, or nothing announced for it yet: then
    there is nothing to bound by). Pushes and saves both ask.

    Why: a token's version is what staleness is measured from; a push claiming v10^6 was never
    stale and trained whatever it carried (issue 48, finding 8)."""
    newest = latest.get(policy)
    if newest is None or claimed is None or int(claimed) <= newest:
        return None
    return Invalid(
        f"{field} claims weight version {int(claimed)} of policy {policy!r}; the newest version "
        f"announced for it is {newest} (a version from the future was never generated)",
        field,
    )


def push_digest(req: TrajectoryPush, packed: dict[tuple[int, int], PackedArrays]) -> str:
    """The body digest of a push (its key aside), packed arrays included: a retry must match."""
    arrays = [b"".join(packed[k].stored()) for k in sorted(packed)]
    return storage.idempotency.digest(req.model_dump_json(exclude={"idempotency_key"}), *arrays)


def push(
    ctx: Context,
    tx: Tx,
    req: TrajectoryPush,
    packed: dict[tuple[int, int], PackedArrays] | None = None,
    refused: dict[str, Any] | None = None,
) -> PushResult:
    """Ingest ``req``; ``packed`` holds arrays that arrived packed
    (:mod:`astraflow.dataflow.storage.packed`). A refusal (``accepted=false``, not a retry's
    cached answer) fills ``refused``: ``field`` (what was wrong) and ``discarded_saves`` (saved
    episodes of the task dropped with the lease, :func:`end_refused_lease`)."""
    packed = packed or {}
    refused = refused if refused is not None else {}
    key = storage.idempotency.scoped("push", req.node_id, req.idempotency_key)
    body_digest = push_digest(req, packed)
    cached = storage.idempotency.remembered(tx, key, "push", body_digest)
    if cached is not None:
        result = PushResult.model_validate(state.unpack(cached))
        result.duplicate = True
        return result
    now = ctx.now()

    def reject(reason: str, field: str | None = None, end_lease: bool = False) -> PushResult:
        """Refuse the push; ``field``: what was wrong, counted as a refusal (None: a race an
        honest node runs into, a late push of a task another lease completed, not counted)."""
        result = PushResult(accepted=False, reason=reason)
        storage.idempotency.remember(
            tx, key, "push", state.pack(result.model_dump()), now, body_digest
        )
        if field is not None:
            refused["field"] = field
        if end_lease:
            refused["discarded_saves"] = end_refused_lease(ctx, tx, req.node_id, req.lease_id)
            result.reason = f"{reason}; lease {req.lease_id!r} ended, task back in the queue"
        return result

    target = storage.leases.for_push(tx, req.lease_id)
    if target is None:
        return reject(f"unknown lease {req.lease_id!r}", "lease_id")
    task_id, lease_state, lease_episodes = target.task_id, target.state, target.episodes
    group_size, is_eval = target.group_size, target.is_eval
    if target.node_id != req.node_id:  # never name the other node: node ids are not for nodes
        return reject(
            f"lease {req.lease_id!r} was granted to another node, not {req.node_id!r}", "lease_id"
        )
    if target.task_state == "done":
        if target.winner == req.lease_id:
            return reject(f"lease {req.lease_id!r} already delivered its whole group")
        return reject(
            f"task {task_id!r} was already completed by another lease (first finisher wins)"
        )
    if lease_state in ("released", "superseded"):
        return reject(f"lease {req.lease_id!r} was {lease_state}")
    if not req.episodes:
        return reject("push carries no episodes", "episodes", end_lease=True)
    remaining = group_size - lease_episodes
    if len(req.episodes) > remaining:
        return reject(
            f"lease {req.lease_id!r} needs {remaining} more episode(s) (group_size {group_size}), "
            f"push has {len(req.episodes)}",
            "episodes",
            end_lease=True,
        )
    roles = ctx.config.roles
    seen: set[str] = set()
    pushed_before = storage.episodes.existing(tx, [ep.id for ep in req.episodes])
    for i, ep in enumerate(req.episodes):
        if ep.task_id != task_id:
            return reject(
                f"episodes[{i}].task_id is {ep.task_id!r}, lease is for {task_id!r}",
                "episodes.*.task_id",
                end_lease=True,
            )
        unknown = {t.role for t in ep.trajectories} - set(roles)
        if unknown:
            return reject(
                f"episodes[{i}] has roles {sorted(unknown)} not in workflow.roles {sorted(roles)}",
                "episodes.*.trajectories.*.role",
                end_lease=True,
            )
        if len({t.role for t in ep.trajectories}) != len(ep.trajectories):
            return reject(
                f"episodes[{i}] has two trajectories for one role",
                "episodes.*.trajectories.*.role",
                end_lease=True,
            )
        if ep.id in seen or ep.id in pushed_before:
            return reject(
                f"episodes[{i}].id {ep.id!r} was already pushed (each episode needs a new id)",
                "episodes.*.id",
                end_lease=True,
            )
        seen.add(ep.id)

    problem = req.policy_problem(
        ctx.config.roles,
        ctx.policy_facts(tx),
        {k: np.frombuffer(p.tokens, dtype="<i4") for k, p in packed.items()},
    )
    if problem is not None:
        raise Invalid(f"invalid TrajectoryPush: {problem.field}: {problem.message}", problem.field)
    arrays_of = {
        i: [
            packed.get((i, j))
            or PackedArrays.from_lists(t.tokens, t.loss_mask, t.logprobs, t.versions)
            for j, t in enumerate(ep.trajectories)
        ]
        for i, ep in enumerate(req.episodes)
    }
    latest = storage.versions.latest_versions(tx)
    for i, ep in enumerate(req.episodes):
        for j, (t, a) in enumerate(zip(ep.trajectories, arrays_of[i], strict=True)):
            claimed = a.max_version if a.n_tokens else None
            field = f"episodes.{i}.trajectories.{j}.versions"
            bad = future_version(claimed, roles[t.role], latest, field)
            if bad is not None:
                raise bad
    n_samples = 0
    storage.episodes.insert_many(
        tx, [_episode_row(ep, req, bool(is_eval), now) for ep in req.episodes]
    )
    for i, ep in enumerate(req.episodes):
        if is_eval:
            record_eval_episode(ctx, tx, target.eval_id, target.eval_policy, ep)
        else:
            arrays = arrays_of[i]
            n_samples += _insert_samples(ctx, tx, ep, req.lease_id, arrays)
            if ctx.transcripts is not None:
                ctx.transcripts.offer(tx, ep, arrays, roles, now)
    storage.leases.add_episodes(tx, req.lease_id, len(req.episodes))
    storage.nodes.add_episodes(tx, req.node_id, len(req.episodes))
    if lease_episodes + len(req.episodes) == group_size:
        _complete(ctx, tx, req.lease_id, target)
    result = PushResult(accepted=True, samples=n_samples)
    storage.idempotency.remember(tx, key, "push", state.pack(result.model_dump()), now, body_digest)
    return result


def end_refused_lease(ctx: Context, tx: Tx, node_id: str, lease_id: str) -> int:
    """End ``node_id``'s lease ``lease_id`` after a refused push (released: its task goes back
    to the queue now, not at a deadline heartbeats keep moving) and discard the episodes saved
    in flight for its task, which the lease may have resumed; returns how many were discarded.
    A lease of another node, or one not active, is left alone."""
    lease = storage.leases.get(tx, lease_id)
    if lease is None or lease.node_id != node_id or lease.state != "active":
        return 0
    storage.leases.mark_released(tx, lease_id)
    discarded = storage.partials.count_of_task(tx, lease.task_id)
    storage.partials.delete_of_task(tx, lease.task_id)
    if not storage.leases.active_count_of_task(tx, lease.task_id):
        storage.tasks.requeue(tx, lease.task_id)
    ctx.wake_after_commit(tx)
    return discarded


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
        reason = error_reason(ep.finish_reason)
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
                None if traj.turn_rewards is None else json.dumps(traj.turn_rewards),
            )
        )
    storage.samples.insert(tx, rows)
    return len(rows)


def error_reason(finish_reason: str) -> str:
    """The drop reason of a failed episode (also the key of status' ``errors``)."""
    return "env_timeout" if finish_reason == "env_timeout" else "episode_error"


def group_id_of(task_id: str, policy: str) -> str:
    """The id of the group that a task's samples of ``policy`` form once the task completes.

    Samples carry it from their insertion: setting it at completion instead rewrote every sample
    row with its token arrays (SQLite rewrites a whole row on update), doubling the bytes written
    per push. Until the group exists no query reaches samples through it, and samples of leases
    that lose the task are deleted in the transaction that creates the group."""
    return f"{task_id}/{policy}"


def _complete(ctx: Context, tx: Tx, lease_id: str, target: PushTarget) -> None:
    now = ctx.now()
    task_id = target.task_id
    # a new group (or a dropped one: backpressure room), an evaluation task done: wake the long
    # polls. A push that completes nothing changes nothing they wait for and wakes nobody.
    ctx.wake_after_commit(tx)
    storage.tasks.finish(tx, task_id, lease_id, now)
    storage.leases.mark_finished(tx, lease_id)
    storage.partials.delete_of_task(tx, task_id)  # nothing of it will be resumed again
    for loser in storage.leases.others_of_task(tx, task_id, lease_id):
        storage.leases.mark_superseded(tx, loser)
        for policy, n in storage.samples.counts_of_lease(tx, loser).items():
            storage.tallies.drops.add(tx, policy, "superseded", n)
        storage.samples.delete_of_lease(tx, loser)
    if target.is_eval:
        return
    ctx.mode.observe_group(now - target.issued_at)  # the pace admission control follows
    by_policy: dict[str, list[LeaseSample]] = {}
    for s in storage.samples.of_lease(tx, lease_id):
        by_policy.setdefault(s.policy, []).append(s)
    for policy, samples in by_policy.items():
        rewards = [s.reward for s in samples]
        mean, std = reward_stats(rewards)
        gen_versions = [s.min_version for s in samples if s.min_version >= 0]
        group_id = group_id_of(task_id, policy)
        view = GroupView(
            id=group_id,
            task_id=task_id,
            policy=policy,
            task_set=target.task_set,
            rewards=rewards,
            min_version=min(gen_versions) if gen_versions else -1,
            priority=target.priority,
            deadline=target.deadline,
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
            NewGroup(
                id=group_id,
                task_id=task_id,
                policy=policy,
                task_set=target.task_set,
                round=target.round,
                size=len(samples),
                reward_mean=mean,
                reward_std=std,
                min_version=view.min_version,
                priority=target.priority,
                deadline=target.deadline,
                state="filtered" if reason else "ready",
                created_at=now,
            ),
        )
        if reason:
            storage.samples.discard_token_arrays(tx, [group_id])
        adaptive.observe(ctx, tx, view)
