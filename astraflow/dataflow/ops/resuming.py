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
"""

from __future__ import annotations

from astraflow.dataflow import storage
from astraflow.dataflow.errors import Invalid
from astraflow.dataflow.ops import leasing
from astraflow.dataflow.ops.context import Context
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
    storage.partials.save(tx, target.task_id, req.lease_id, req.node_id, req.partials, ctx.now())
    return PartialResult(accepted=True, stored=len(req.partials))
