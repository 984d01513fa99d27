"""Run a batch of tasks through a workflow, a bounded number at once, and keep every outcome.

Why a module of its own: evaluation must run episodes exactly as a rollout node does (the workflow
function called with role policies and the env runner's factory), but without a dataflow service,
leases or weight updates. What comes back per task is the workflow's :class:`Episode`, or the
exception that stopped it (a benchmark decides what an exception means, e.g. a skipped sample).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from astraflow.protocol import Episode, Task, Trajectory
from astraflow.rollout.workflows.base import EnvFactory, RolePolicy, WorkflowSpec


@dataclass
class Outcome:
    """One task's result: the episode, or the error that ended it; the policies that acted."""

    task: Task
    policies: Mapping[str, RolePolicy]
    #: The env factory the episode used (what ``envs_for(task)`` returned).
    envs: EnvFactory | None = None
    episode: Episode | None = None
    error: BaseException | None = None
    seconds: float = 0.0


async def run_tasks(
    tasks: Iterable[Task],
    workflow: WorkflowSpec,
    policies_for: Callable[[Task], Mapping[str, RolePolicy]],
    envs_for: Callable[[Task], EnvFactory],
    *,
    workflow_kwargs: Mapping[str, Any] | None = None,
    concurrency: int = 4,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """One episode per task through ``workflow``, at most ``concurrency`` at once, in task order.

    ``policies_for(task)`` gives the role policies of that task's episode (a shared engine, or one
    built for the episode); ``envs_for(task)`` the env factory it uses (an ``EnvRunner.make``, or a
    per-episode wrapper of it that observes the env); ``workflow_kwargs`` override the workflow's defaults, as a recipe's
    ``[workflow]`` section does on a node.
    """
    kwargs = {**workflow.defaults, **(workflow_kwargs or {})}
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task) -> Outcome:
        async with gate:
            outcome = Outcome(task, policies_for(task), envs_for(task))
            started = time.perf_counter()
            try:
                outcome.episode = await workflow.fn(task, outcome.policies, outcome.envs, **kwargs)
            except Exception as exc:  # one broken sample must not stop the evaluation
                outcome.error = exc
            outcome.seconds = round(time.perf_counter() - started, 3)
        if on_outcome:
            on_outcome(outcome)
        return outcome

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def generated_texts(trajectory: Trajectory, tokenizer: Any) -> list[str]:
    """The text of each generated turn: the runs of loss-mask-1 tokens, decoded one by one."""
    texts: list[str] = []
    run: list[int] = []
    for token, mask in zip(trajectory.tokens, trajectory.loss_mask, strict=True):
        if mask:
            run.append(int(token))
        elif run:
            texts.append(tokenizer.decode(run, skip_special_tokens=True))
            run = []
    if run:
        texts.append(tokenizer.decode(run, skip_special_tokens=True))
    return texts
