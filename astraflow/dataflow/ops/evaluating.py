"""Held-out evaluation run by the rollout nodes as special tasks.

``POST /evaluations`` enqueues ``num_tasks`` evaluation tasks (group size 1, top priority,
``meta.eval = true``) that are leased only to nodes holding at least the requested version. Their
episodes never become training samples; the policy's reward (mean over the roles it plays; an
episode with an error scores 0 and is counted in ``errors``) aggregates into accuracy = mean reward.
Evaluation tasks never count towards the run's completion, but nodes are not told to stop while
one is outstanding.
"""

from __future__ import annotations

from astraflow.dataflow import storage
from astraflow.dataflow.config import EVAL_PRIORITY
from astraflow.dataflow.errors import Invalid, NotFound
from astraflow.dataflow.ops import state
from astraflow.dataflow.ops.context import Context
from astraflow.dataflow.ops.task_feeder import task_row
from astraflow.dataflow.storage.store import Tx
from astraflow.protocol import Episode, EvaluationRequest, EvaluationResult, Task, new_id


def request(ctx: Context, tx: Tx, req: EvaluationRequest) -> EvaluationResult:
    key = storage.idempotency.scoped("evaluation", req.policy, req.idempotency_key)
    body_digest = storage.idempotency.digest(req.model_dump_json(exclude={"idempotency_key"}))
    cached = storage.idempotency.remembered(tx, key, "evaluation", body_digest)
    if cached is not None:
        return get(tx, str(state.unpack(cached)))
    recipe = ctx.config.recipe
    if req.policy not in recipe.policies:
        raise Invalid(
            f"unknown policy {req.policy!r}; recipe policies: {sorted(recipe.policies)}", "policy"
        )
    if req.policy not in ctx.config.workflow_policies:
        raise Invalid(f"policy {req.policy!r} plays no role in the workflow", "policy")
    task_set = req.task_set or recipe.evaluation.task_set or recipe.tasks.sets[0].name
    split = req.split or recipe.evaluation.split
    num = req.num_tasks or recipe.evaluation.num_tasks
    try:
        # the training set's kwargs (e.g. a difficulty level) apply to its held-out split too
        kwargs = next((dict(s.kwargs) for s in recipe.tasks.sets if s.name == task_set), {})
        payloads = ctx.feeder.source(task_set, split, seed=recipe.run.seed, limit=num, **kwargs)
    except KeyError as exc:
        raise Invalid(str(exc).strip("'\""), "task_set") from None
    except ValueError as exc:
        raise Invalid(str(exc), "split") from None
    if not payloads:
        raise Invalid(f"task set {task_set!r} split {split!r} has no tasks", "task_set")
    eval_id = new_id("eval")
    now = ctx.now()
    rows = []
    for i, payload in enumerate(payloads):
        meta = {
            "eval": True,
            "eval_id": eval_id,
            "policy": req.policy,
            "min_version": req.version,
            "greedy": True,
        }
        if recipe.evaluation.max_tokens:
            meta["max_tokens"] = recipe.evaluation.max_tokens
        task = Task(
            id=f"{eval_id}:{i}",
            env=recipe.tasks.env,
            payload=payload,
            workflow=recipe.workflow.name,
            group_size=1,
            task_set=task_set,
            priority=EVAL_PRIORITY,
            meta=meta,
        )
        rows.append(task_row(task, now))
    storage.tasks.insert(tx, rows)
    step = req.step if req.step is not None else req.version
    storage.evaluations.insert(
        tx, eval_id, req.policy, req.version, step, task_set, split, len(rows), now
    )
    storage.idempotency.remember(tx, key, "evaluation", state.pack(eval_id), now, body_digest)
    return get(tx, eval_id)


def record_eval_episode(ctx: Context, tx: Tx, eval_id: str, policy: str, ep: Episode) -> None:
    if ep.error is not None:
        reward, error = 0.0, 1
    else:
        role_rewards = [r for role, r in ep.rewards.items() if ctx.config.roles.get(role) == policy]
        reward, error = (sum(role_rewards) / len(role_rewards) if role_rewards else 0.0), 0
    storage.evaluations.add_episode(tx, eval_id, error, reward)
    row = storage.evaluations.progress(tx, eval_id)
    if row and row.completed >= row.num_tasks and row.finished_at is None:
        now = ctx.now()
        storage.evaluations.mark_finished(tx, eval_id, now)
        result = get(tx, eval_id)
        ctx.metrics.record(
            tx,
            {
                "type": "eval",
                "policy": result.policy,
                "version": result.version,
                "step": result.step,
                "task_set": result.task_set,
                "split": result.split,
                "accuracy": result.accuracy,
                "n": result.completed,
                "errors": result.errors,
                "time": now,
            },
        )


def _result(row: tuple) -> EvaluationResult:
    """An evaluation row (:data:`storage.evaluations.COLUMNS`) as the wire type."""
    (
        eid,
        policy,
        version,
        step,
        task_set,
        split,
        num,
        completed,
        errors,
        reward_sum,
        created,
        finished,
    ) = row
    return EvaluationResult(
        id=eid,
        policy=policy,
        version=version,
        step=step,
        task_set=task_set,
        split=split,
        num_tasks=num,
        completed=completed,
        errors=errors,
        accuracy=(reward_sum / completed) if completed else None,
        done=finished is not None,
        created_at=created,
        finished_at=finished,
    )


def get(tx: Tx, eval_id: str) -> EvaluationResult:
    row = storage.evaluations.get(tx, eval_id)
    if row is None:
        raise NotFound(f"unknown evaluation {eval_id!r}", "eval_id")
    return _result(row)


def list_all(tx: Tx, policy: str | None = None) -> list[EvaluationResult]:
    return [_result(r) for r in storage.evaluations.list_rows(tx, policy)]
