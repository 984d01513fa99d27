"""``astraflow eval run``: any registered env on any task set, through the training path.

Each payload of the set becomes ``samples`` :class:`Task` objects for the env and runs through the
workflow a recipe would train with (``single_agent`` by default), with the policy's engine and with
envs made by an :class:`EnvRunner`, via :func:`.episodes.run_tasks` (the path ``eval agentbench``
uses). So the prompt rendering, token sequence and turn and token limits are the training ones.

Scores: a sample succeeds when the env says ``info["success"]`` (the contract of every AstraFlow
env), else when its reward is positive (plain Gymnasium envs). Accuracy is the success rate over all
samples; pass@k uses the unbiased estimator of Chen et al. (2021) over each task's ``samples``
attempts; turns and tokens are means over samples (tokens: those the policy generated).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from astraflow.protocol import Task
from astraflow.protocol.transcripts import episode_turns
from astraflow.rollout.evaluation.episodes import Outcome, run_tasks


@dataclass
class TaskSetEval:
    env: str
    task_set: str
    split: str = "test"
    limit: int | None = None
    #: Attempts per task (pass@k needs k <= samples).
    samples: int = 1
    concurrency: int = 8
    max_turns: int = 1
    workflow: str = "single_agent"
    seed: int = 0
    #: Kwargs of the task-set loader (e.g. path= for jsonl) and of the env.
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    env_timeout_s: float | None = 120.0
    #: workflow ``openai_agent``: the agent function ('package.module:function' or 'file.py:fn')
    agent: str | None = None

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1, got {self.limit}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` of ``n`` attempts (``c`` correct) succeeds."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(samples: int) -> list[int]:
    """1, 2, 4, ... up to and including ``samples``."""
    ks, k = [], 1
    while k < samples:
        ks.append(k)
        k *= 2
    return [*ks, samples]


def succeeded(outcome: Outcome) -> bool:
    ep = outcome.episode
    if outcome.error is not None or ep is None or ep.error:
        return False
    if "success" in ep.info:
        return bool(ep.info["success"])
    return sum(ep.rewards.values()) > 0


def sample_row(
    outcome: Outcome, decode: Callable[[list[int]], str] | None = None
) -> dict[str, Any]:
    ep = outcome.episode
    row: dict[str, Any] = {
        "task": str(outcome.task.meta.get("payload_id")),
        "sample": int(outcome.task.meta.get("sample", 0)),
        "success": succeeded(outcome),
        "seconds": outcome.seconds,
    }
    if outcome.error is not None or ep is None:
        row["error"] = f"{type(outcome.error).__name__}: {outcome.error}"
        return row
    row.update(
        reward=sum(ep.rewards.values()),
        finish_reason=ep.finish_reason,
        turns=sum(t.num_turns for t in ep.trajectories),
        tokens=sum(int(sum(t.loss_mask)) for t in ep.trajectories),
        versions=sorted(
            {
                int(v)
                for t in ep.trajectories
                for v, m in zip(t.versions, t.loss_mask, strict=True)
                if m
            }
        ),
    )
    if decode is not None:  # the decoded text of each turn, so the report shows what was said
        row["transcript"] = [t.model_dump(exclude={"start"}) for t in episode_turns(ep, decode)]
    for key in ("tool_calls", "invalid_tool_calls"):  # function-calling workflows count these
        if key in ep.metrics:
            row[key] = int(ep.metrics[key])
    if ep.error:
        row["error"] = ep.error
    return row


def summarise(rows: list[dict[str, Any]], samples: int) -> dict[str, Any]:
    """Accuracy, pass@k, mean reward, turns and tokens over ``rows`` (one per sample)."""
    by_task: dict[str, list[bool]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(bool(r["success"]))
    n = len(rows)
    ran = [r for r in rows if "turns" in r]

    def mean(key: str, over: list[dict[str, Any]]) -> float | None:
        return sum(r[key] for r in over) / len(over) if over else None

    return {
        "tasks": len(by_task),
        "samples": n,
        "accuracy": sum(r["success"] for r in rows) / n if n else 0.0,
        "pass_at_k": {
            str(k): sum(pass_at_k(len(v), sum(v), k) for v in by_task.values()) / len(by_task)
            for k in ks_for(samples)
        }
        if by_task
        else {},
        "mean_reward": mean("reward", ran),
        "mean_turns": mean("turns", ran),
        "mean_tokens": mean("tokens", ran),
        "errors": sum(1 for r in rows if "error" in r),
    }


def make_tasks(config: TaskSetEval, payloads: list[dict[str, Any]], workflow: str) -> list[Task]:
    tasks = []
    for i, payload in enumerate(payloads):
        pid = str(payload.get("id", i))
        for s in range(config.samples):
            tasks.append(
                Task(
                    id=f"eval-{config.task_set}-{config.split}-{i}-{s}"[:256],
                    env=config.env,
                    payload=payload,
                    workflow=workflow,
                    task_set=config.task_set,
                    meta={"eval": True, "payload_id": pid, "sample": s},
                )
            )
    return tasks


async def evaluate_task_set(
    agent: Any,
    config: TaskSetEval,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
    *,
    workflows: Any = None,
    task_sets: Any = None,
) -> dict[str, Any]:
    """Run ``config`` with ``agent`` (an :class:`~.agents.EngineAgent` or scripted one) and return
    the report: ``summary`` (see :func:`summarise`), ``samples`` (one row each) and ``meta``."""
    from astraflow.envs import default_registry
    from astraflow.rollout.env_runner import EnvRunner
    from astraflow.rollout.workflows import default_workflows
    from astraflow.tasks.catalog import default_task_sets

    registry = default_registry()
    registry.get(config.env)  # unknown env: a clear error before anything loads
    spec = (workflows or default_workflows()).get(config.workflow)
    payloads = (task_sets or default_task_sets()).load(
        config.task_set, config.split, seed=config.seed, limit=config.limit, **config.task_kwargs
    )
    if not payloads:
        raise ValueError(f"task set {config.task_set!r} split {config.split!r} has no tasks")
    tasks = make_tasks(config, payloads, spec.name)
    if on_start:
        on_start(len(tasks))
    runner = EnvRunner(
        lambda env_id, kwargs: registry.make(env_id, **kwargs),
        workers=max(1, config.concurrency),
        timeout_s=config.env_timeout_s,
    )
    rows_by_id: dict[str, dict[str, Any]] = {}

    tokenizer = getattr(getattr(agent, "engine", None), "tokenizer", None)
    decode = None
    if tokenizer is not None:

        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=False)

    def done(outcome: Outcome) -> None:
        rows_by_id[outcome.task.id] = row = sample_row(outcome, decode)
        if on_result:
            on_result(row)

    started = time.time()
    try:
        outcomes = await run_tasks(
            tasks,
            spec,
            agent.policies,
            lambda task: runner.make,
            workflow_kwargs={
                "max_turns": config.max_turns,
                "max_total_tokens": agent.max_total_tokens,
                **({"agent": config.agent} if config.agent else {}),
                **config.env_kwargs,
            },
            concurrency=config.concurrency,
            on_outcome=done,
        )
    finally:
        runner.shutdown()
    rows = [rows_by_id[o.task.id] for o in outcomes]
    meta = {
        **asdict(config),
        "agent": agent.name,
        "workflow": spec.name,
        "wall_s": round(time.time() - started, 2),
    }
    return {"summary": summarise(rows, config.samples), "meta": meta, "samples": rows}
