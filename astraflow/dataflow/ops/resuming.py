"""Episodes that outlive their node: a node saves the episodes of a lease it holds that are still
in flight (``POST /partials``, :func:`save`); the task's next lease carries them
(``ops.leasing``), so the node that takes the task over resumes each from its saved turn; the saves
go when the task completes (``ops.ingest``).

The rules (docs/elastic.md, "Episodes that survive a node's death"):

- Only the node holding an active lease of the task may save: a lease expired, released or
  superseded, another node's lease, a task already done are refused (``accepted=false``), so a
  node that comes back from a partition cannot overwrite what the new lease saved.
- Every value is checked at the door as a push's are: the token arrays by the protocol types,
  the episode index below the task's group size, roles of the workflow, token ids within the
  policy's vocabulary and context (422 naming the field).
- One row per (task, episode index): a newer save of that episode replaces the older one, whichever
  lease of the task made it.
- A save is bound to what the service issued (issue 48, finding 3: nodes are untrusted, and the
  node that resumes a save is another, honest one): its env state, where it names a task payload
  (``env_state["task"]``, what every ``StateMixin`` env saves), must name the lease's own task
  payload; no token may claim a weight version newer than the newest the service announced for
  its policy; a finished episode's id must never have been pushed and be used by no other saved
  episode of the task (a save reusing pushed ids made every push of the task's next lease fail,
  for good: finding 1). A save that fails is refused whole (422 naming the field and what was
  expected; counted in ``/status.refused``) and nothing of it is stored. Rewards are not
  checked here: the node that resumes never carries them (``astraflow.rollout.node``).
"""

from __future__ import annotations

import json
from typing import Any

from astraflow.dataflow import storage
from astraflow.dataflow.errors import Invalid
from astraflow.dataflow.ops import leasing
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.ops.ingest import future_version
from astraflow.dataflow.ops.task_feeder import load_task
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol import PartialPush, PartialResult


def save(ctx: Context, tx: Tx, req: PartialPush) -> PartialResult:
    leasing.check_node(req.node_id, storage.nodes.state(tx, req.node_id))
    target = storage.leases.for_push(tx, req.lease_id)
    if target is None:
        return PartialResult(accepted=False, reason=f"unknown lease {req.lease_id!r}")
    if target.node_id != req.node_id:  # never name the other node
        return PartialResult(
            accepted=False,
            reason=f"lease {req.lease_id!r} was granted to another node, not {req.node_id!r}",
        )
    if target.state != "active":
        return PartialResult(accepted=False, reason=f"lease {req.lease_id!r} is {target.state}")
    if target.task_state == "done":
        return PartialResult(accepted=False, reason=f"task {target.task_id!r} is already done")
    roles = ctx.config.roles
    seen: set[int] = set()
    for i, partial in enumerate(req.partials):
        if partial.index >= target.group_size:
            raise Invalid(
                f"partials.{i}.index is {partial.index}, the task has {target.group_size} "
                "episode(s)",
                f"partials.{i}.index",
            )
        if partial.index in seen:
            raise Invalid(f"partials.{i}.index {partial.index} is saved twice", f"partials.{i}")
        seen.add(partial.index)
        if partial.finished is not None and partial.finished.task_id != target.task_id:
            raise Invalid(
                f"partials.{i}.finished.task_id is {partial.finished.task_id!r}, the lease is "
                f"for {target.task_id!r}",
                f"partials.{i}.finished.task_id",
            )
        names = [t.role for t in partial.trajectories]
        unknown = set(names) - set(roles)
        if unknown:
            raise Invalid(
                f"partials.{i} has roles {sorted(unknown)} not in workflow.roles {sorted(roles)}",
                f"partials.{i}.trajectories",
            )
        unknown = {t.role for t in partial.all_trajectories} - set(roles)
        if unknown:
            raise Invalid(
                f"partials.{i}.finished has roles {sorted(unknown)} not in workflow.roles "
                f"{sorted(roles)}",
                f"partials.{i}.finished",
            )
        if len(set(names)) != len(names):
            raise Invalid(
                f"partials.{i} has two trajectories for one role", f"partials.{i}.trajectories"
            )
    problem = req.policy_problem(roles, ctx.policy_facts(tx))
    if problem is not None:
        raise Invalid(f"invalid PartialPush: {problem.field}: {problem.message}", problem.field)
    check_binding(ctx, tx, req, target.task_id)
    storage.partials.save(tx, target.task_id, req.lease_id, req.node_id, req.partials, ctx.now())
    return PartialResult(accepted=True, stored=len(req.partials))


def canonical(value: Any) -> str:
    """A payload as comparable text (key order and tuple/list spelling aside)."""
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def check_binding(ctx: Context, tx: Tx, req: PartialPush, task_id: str) -> None:
    """Raise :class:`Invalid` (422) unless every saved episode of ``req`` is bound to what the
    service issued for lease ``req.lease_id`` (see the module's rules)."""
    body = storage.leases.task_body(tx, req.lease_id)
    payload = canonical(load_task(body).payload) if body is not None else None
    latest = storage.versions.latest_versions(tx)
    roles = ctx.config.roles
    finished_ids: dict[str, int] = {}
    for i, partial in enumerate(req.partials):
        env_state = partial.env_state
        if isinstance(env_state, dict) and "task" in env_state and payload is not None:
            if canonical(env_state["task"]) != payload:
                raise Invalid(
                    f"partials.{i}.env_state.task is not the task payload of lease "
                    f"{req.lease_id!r} (task {task_id!r}): a saved env state must be the state "
                    "of the lease's own task",
                    f"partials.{i}.env_state.task",
                )
        saved = [(f"partials.{i}.trajectories", partial.trajectories)]
        if partial.finished is not None:
            saved.append((f"partials.{i}.finished.trajectories", partial.finished.trajectories))
        for prefix, trajectories in saved:
            for j, traj in enumerate(trajectories):
                policy = roles.get(traj.role, "")
                claimed = max(traj.versions) if len(traj.versions) else None
                bad = future_version(claimed, policy, latest, f"{prefix}.{j}.versions")
                if bad is not None:
                    raise bad
        if partial.finished is not None:
            finished_ids[partial.finished.id] = i
    if not finished_ids:
        return
    field = "partials.{}.finished.id"
    if len(finished_ids) != sum(p.finished is not None for p in req.partials):
        raise Invalid("two saved episodes of the push share one finished.id", "partials")
    pushed = storage.episodes.existing(tx, list(finished_ids))
    if pushed:
        ep_id = min(pushed)  # name one, the same one each time
        i = finished_ids[ep_id]
        raise Invalid(
            f"partials.{i}.finished.id {ep_id!r} was already pushed; a saved episode needs an "
            "id never pushed before",
            field.format(i),
        )
    by_index = {p.index for p in req.partials}
    for row in storage.partials.of_task(tx, task_id):
        if row.finished is None or row.index in by_index:
            continue
        if row.finished.id in finished_ids:
            i = finished_ids[row.finished.id]
            raise Invalid(
                f"partials.{i}.finished.id {row.finished.id!r} is already the id of saved "
                f"episode {row.index} of task {task_id!r}; each episode needs its own id",
                field.format(i),
            )
