"""``astraflow eval agentbench``: AgentBench v0.2 (dbbench, os_interaction, alfworld) through the
training path.

Each sample becomes a :class:`Task` for its env (``astraflow/AgentBench-DB-v0``, ``-OS-v0`` or
``-ALFWorld-v0``) and
runs through the workflow the AgentBench recipes train with (``single_agent``), with the agent's
engine, and with envs created by an :class:`EnvRunner` (env calls never on the event loop). So what
is evaluated is what is trained: the same prompt rendering, token sequence, turn and token limits.

The episode's outcome is read back the way AgentBench reads it (the env's final status and judge,
see :mod:`astraflow.envs.agentbench.status`) and AgentBench's metrics come from :mod:`astraflow.envs.agentbench.report`.
The oracle (``--agent oracle``) is a :class:`ScriptedAgent` replaying each sample's reference
solution (:mod:`astraflow.envs.agentbench.oracle`) through a scripted engine, which checks the harness itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from astraflow.envs.agentbench.oracle import OracleEpisode
from astraflow.envs.agentbench.report import SampleResult, build_report
from astraflow.envs.agentbench.status import SampleStatus, TaskSkipped
from astraflow.protocol import Task
from astraflow.rollout.evaluation.agents import ScriptedAgent
from astraflow.rollout.evaluation.episodes import Outcome, generated_texts, run_tasks

FAMILIES = ("dbbench", "os", "alfworld")
#: How long one env call may take (an OS sample's set-up runs init scripts of up to 120 s each).
ENV_TIMEOUT_S = 900.0


@dataclass
class EvalConfig:
    tasks: tuple[str, ...] = FAMILIES
    split: str = "dev"
    data_dir: str | None = None
    db: str | None = None
    sandbox: str = "auto"
    concurrency: int = 4
    limit: int | None = None
    #: The workflow the episodes run through (the AgentBench recipes' workflow).
    workflow: str = "single_agent"
    env_timeout_s: float | None = ENV_TIMEOUT_S


@dataclass(frozen=True)
class Family:
    """One AgentBench task family: its env, its round limit and its data loader."""

    name: str
    env_id: str
    #: Turns the workflow gives the env: the env's own round limit (AgentBench's), which it
    #: enforces itself with AgentBench's status, so the workflow's limit never cuts first.
    max_turns: int
    load: Callable[[str | None, str], list[dict[str, Any]]]


def family(name: str) -> Family:
    from astraflow.envs.agentbench import ALFWORLD_ENV_ID, DB_ENV_ID, OS_ENV_ID, data

    if name == "dbbench":
        from astraflow.envs.agentbench.dbbench.env import MAX_ROUND

        return Family(name, DB_ENV_ID, MAX_ROUND + 1, data.load_dbbench)
    if name == "os":
        from astraflow.envs.agentbench.os.env import ROUND_LIMIT

        return Family(name, OS_ENV_ID, ROUND_LIMIT, data.load_os)
    if name == "alfworld":
        from astraflow.envs.agentbench.alfworld.protocol import MAX_STEP

        return Family(name, ALFWORLD_ENV_ID, MAX_STEP, data.load_alfworld)
    raise ValueError(f"unknown task family {name!r}; expected one of {', '.join(FAMILIES)}")


def oracle_agent() -> ScriptedAgent:
    """The reference-solution replayer, one scripted engine per episode (the task says which)."""
    return ScriptedAgent(
        "oracle", lambda task: OracleEpisode(task.meta["family"], task.payload).reply
    )


def make_tasks(fam: Family, payloads: list[dict[str, Any]], workflow: str) -> list[Task]:
    return [
        Task(
            id=f"agentbench-{fam.name}-{i}-{p.get('id', '')}"[:256],
            env=fam.env_id,
            payload=p,
            workflow=workflow,
            task_set=f"agentbench_{fam.name}",
            meta={"eval": True, "family": fam.name},
        )
        for i, p in enumerate(payloads)
    ]


def env_kwargs(fam: Family, config: EvalConfig, meta: dict[str, Any]) -> dict[str, Any]:
    """The family's env kwargs; builds what all its envs share (one sandbox factory) and notes
    the backend in ``meta``. Raises ValueError on a bad database URL before any episode runs."""
    if fam.name == "os":
        from astraflow.envs.agentbench.data import dockerfiles_dir
        from astraflow.envs.agentbench.os.sandbox import select_sandbox

        sandbox = select_sandbox(config.sandbox, dockerfiles_dir(config.data_dir))
        meta["sandbox"] = sandbox.backend
        return {"sandbox": sandbox, "data_dir": config.data_dir}
    if fam.name == "alfworld":
        from astraflow.envs.agentbench.alfworld.game import require_textworld

        meta["alfworld"] = require_textworld()
        return {}
    from astraflow.envs.agentbench.dbbench.backends import make_backend

    meta["db"] = make_backend(config.db).describe()
    return {"db": config.db}


class ScoredEnd:
    """One episode's env factory: makes the env through the runner and, when the workflow stops
    before the env ended the episode (the agent's context is full), has the env score the episode
    as it stands, as AgentBench does (``env.abort``: a modification is still judged by its table
    hash). The workflow itself stays the training one; this only observes its env."""

    def __init__(self, runner: Any):
        self.runner = runner
        self.env: Any = None
        self.started = self.ended = False
        #: The env's info from that late scoring (None when the env ended the episode itself).
        self.info: dict[str, Any] | None = None

    async def __call__(self, env_id: str, kwargs: dict[str, Any]) -> ScoredEnd:
        self.env = await self.runner.make(env_id, kwargs)
        return self

    async def reset(self, *, seed: int | None = None, options: dict | None = None):
        out = await self.env.reset(seed=seed, options=options)
        self.started, self.ended = True, False
        return out

    async def step(self, action: str):
        out = await self.env.step(action)
        self.ended = bool(out[2] or out[3])
        return out

    async def close(self) -> None:
        abort = getattr(self.env.env, "abort", None)
        try:
            if self.started and not self.ended and abort is not None:
                status = SampleStatus.AGENT_CONTEXT_LIMIT
                self.info = await self.runner.call(
                    "env.abort", abort, status, env_id=self.env.env_id
                )
        except Exception as exc:  # must not mask how the episode ended; reported as not passed
            self.info = {"success": False, "error": f"scoring at the end failed: {exc}"}
        finally:
            await self.env.close()


def sample_result(fam: Family, outcome: Outcome) -> SampleResult:
    """AgentBench's view of one episode: the env's final status, judge and answer."""
    payload = outcome.task.payload
    res = SampleResult(
        fam.name,
        str(payload.get("id")),
        SampleStatus.UNKNOWN.value,
        False,
        type=str(payload.get("type", "")),
        seconds=outcome.seconds,
    )
    if isinstance(outcome.error, TaskSkipped):
        res.status, res.skipped, res.reason = SampleStatus.SKIPPED.value, True, str(outcome.error)
        return res
    episode = outcome.episode
    if outcome.error is not None or episode is None or episode.error:
        err = outcome.error
        res.status = SampleStatus.TASK_ERROR.value
        res.reason = f"{type(err).__name__}: {err}" if err is not None else str(episode.error)
        return res
    res.finish_reason = episode.finish_reason
    if episode.trajectories:
        (policy,) = outcome.policies.values()
        traj = episode.trajectories[0]
        res.turns = traj.num_turns
        res.replies = [r[:2000] for r in generated_texts(traj, policy.tokenizer)]
    info = episode.info
    late = getattr(outcome.envs, "info", None)
    if episode.finish_reason == "terminated":
        res.status = str(info.get("status", SampleStatus.UNKNOWN.value))
        res.passed = bool(info.get("success", False))
    else:  # "length": the conversation outgrew the agent's context (else a workflow turn limit)
        context = episode.finish_reason == "length"
        res.status = (
            SampleStatus.AGENT_CONTEXT_LIMIT if context else SampleStatus.TASK_LIMIT_REACHED
        ).value
        if late is not None:
            info = {**info, **late, "status": res.status}
            res.passed = bool(late.get("success", False))
    res.answer = None if info.get("answer") is None else str(info.get("answer"))
    res.reason = str(info.get("judge", info.get("error", "")))
    if info.get("load_error"):  # e.g. MySQL refused the table (AgentBench runs on)
        res.reason = f"table not loaded: {info['load_error']}"
    return res


async def evaluate(
    agent: Any,
    config: EvalConfig,
    on_start: Callable[[str, int], None] | None = None,
    on_result: Callable[[SampleResult], None] | None = None,
    *,
    workflows: Any = None,
) -> dict[str, Any]:
    """Run every requested family and return AgentBench's JSON report (see
    :func:`astraflow.envs.agentbench.report.build_report`).

    ``agent``: an :class:`EngineAgent` or :class:`ScriptedAgent` (e.g. :func:`oracle_agent`);
    ``workflows``: the registry to look the workflow up in (default: every installed workflow).
    """
    from astraflow.envs import default_registry
    from astraflow.rollout.env_runner import EnvRunner
    from astraflow.rollout.workflows import default_workflows

    families = [family(name) for name in config.tasks]
    spec = (workflows or default_workflows()).get(config.workflow)
    registry = default_registry()
    runner = EnvRunner(
        lambda env_id, kwargs: registry.make(env_id, **kwargs),
        workers=max(1, config.concurrency),  # a command waiting 30 s must not hold up the others
        timeout_s=config.env_timeout_s,
    )
    started = time.time()
    meta: dict[str, Any] = {
        "agent": agent.name,
        "split": config.split,
        "data": config.data_dir,
        "workflow": spec.name,
    }
    results: dict[str, list[SampleResult]] = {}
    try:
        for fam in families:
            payloads = fam.load(config.data_dir, config.split)[: config.limit or None]
            kwargs = {
                "max_turns": fam.max_turns,
                "max_total_tokens": agent.max_total_tokens,
                **env_kwargs(fam, config, meta),
            }
            if on_start:
                on_start(fam.name, len(payloads))

            scored: dict[str, SampleResult] = {}

            def done(outcome: Outcome, fam: Family = fam, scored=scored) -> None:
                scored[outcome.task.id] = res = sample_result(fam, outcome)
                if on_result:
                    on_result(res)

            outcomes = await run_tasks(
                make_tasks(fam, payloads, spec.name),
                spec,
                agent.policies,
                lambda task: ScoredEnd(runner),
                workflow_kwargs=kwargs,
                concurrency=config.concurrency,
                on_outcome=done,
            )
            results[fam.name] = [scored[o.task.id] for o in outcomes]
    finally:
        runner.shutdown()
    meta["wall_s"] = round(time.time() - started, 2)
    return build_report(results, meta)
