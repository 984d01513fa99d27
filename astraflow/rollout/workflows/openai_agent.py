"""``openai_agent``: any async function written against the ``openai`` SDK is a workflow.

Recipe: ``workflow.name = "openai_agent"``, ``workflow.agent = "package.module:function"`` (or
``"path/to/file.py:function"``). The function is called once per episode as
``await agent(client, payload)``, or ``await agent(client, payload, env=env)`` when it has an
``env`` parameter, where ``client`` is an ``openai.AsyncOpenAI`` bound to this node's recording
endpoint (see :mod:`.agent_gateway`), ``payload`` the task's payload (a copy) and ``env`` the task's
env, already reset with the task (``env.observation`` holds the first observation,
``await env.step(action)`` the usual 5-tuple). Model names are the workflow roles (``agent`` by
default); every call under one name is one conversation and becomes that role's trajectory
(:mod:`.call_recorder`).

The episode's reward comes from what the function returns:
- a number (or bool): the reward of every role that made calls;
- a mapping ``role -> number``: one reward per role;
- a string: a final answer, scored by the task's env (one ``step`` after ``reset``, or a step of
  the env the function was given);
- ``None``: the rewards the function collected by stepping the env it was given.

Per-call rewards (AReaL's ``set_reward``): ``client.set_reward(reward, call=-1, model=None)``
credits one call of a model (its index among that model's calls in the episode, negative from the
end; default the latest call of the one model called so far). A role whose calls got rewards keeps
them per turn on its trajectory (``Trajectory.turn_rewards``, which ``trainer.turn_discount``
turns into per-turn returns); the function's returned reward is added to its last call, and the
role's episode reward is the sum.

Tools: the agent may pass ``tools``/``tool_choice`` (the OpenAI Agents SDK's ``@function_tool``
agents through ``OpenAIChatCompletionsModel`` do); the gateway renders them with the policy's chat
template and returns ``tool_calls`` read by the policy's ``tool_parser``; the agent runs its tools
itself and sends the results back as ``tool`` messages.

An episode whose conversation reaches ``min(max_total_tokens, engine context - 1)`` ends with
``finish_reason = "length"`` and is kept: the calls past that point get empty ``length`` replies,
and should the agent raise after that (it had no room to finish), the episode is still kept,
scored by the env it stepped (0 when it took none). A reply whose tool call did not parse makes
the episode ``invalid_tool_call`` (counted in ``metrics["invalid_tool_calls"]``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping
from typing import Any

from astraflow.plugins import import_location
from astraflow.protocol import Episode, Task
from astraflow.rollout.workflows.agent_gateway import AgentGateway, AgentSession
from astraflow.rollout.workflows.base import EnvFactory, RolePolicy, WorkflowError, WorkflowSpec
from astraflow.rollout.workflows.call_recorder import EpisodeCalls
from astraflow.rollout.workflows.single_agent import _jsonable

AGENT_FORMAT = "'package.module:function' or 'path/to/file.py:function'"


def load_agent(ref: str) -> tuple[Any, bool]:
    """The async function ``ref`` names, and whether it takes an ``env`` parameter."""
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise WorkflowError(f"workflow.agent must be {AGENT_FORMAT}, got {ref!r}")
    where, name = ref.split(":")
    try:
        module = import_location(where, "astraflow_agent", fresh=True)
    except Exception as exc:
        raise WorkflowError(
            f"workflow.agent {ref!r}: cannot import {where!r} ({type(exc).__name__}: {exc}); "
            "the module must be importable on every rollout node (PYTHONPATH or installed)"
        ) from exc
    fn = getattr(module, name, None)
    if fn is None:
        raise WorkflowError(f"workflow.agent {ref!r}: {where!r} has no attribute {name!r}")
    if not (
        inspect.iscoroutinefunction(fn)
        or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))
    ):
        raise WorkflowError(
            f"workflow.agent {ref!r} must be an async function: "
            "async def agent(client, payload[, env]) -> reward | answer | None"
        )
    params = inspect.signature(fn).parameters
    positional = [
        p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params.values())
    if len(positional) < 2 and not varargs:
        raise WorkflowError(
            f"workflow.agent {ref!r} must take (client, payload[, env]); it takes "
            f"({', '.join(params)})"
        )
    return fn, "env" in params


def literal_model_names(fn: Any) -> set[str]:
    """The ``model="..."`` string literals in ``fn``'s source: the model names the agent asks
    for where they are written out. Each must be a workflow role (the node's gateway answers any
    other name 404, and every episode fails), so ``recipe check`` compares them with the roles
    before a run. Names built at run time are not seen; a function without source gives none."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return set()
    return {
        kw.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg == "model" and isinstance(kw.value, ast.Constant)
        if isinstance(kw.value.value, str)
    }


class ScoredEnv:
    """The task's env as an agent sees it: reset with the task, rewards summed as it steps."""

    def __init__(self, env: Any):
        self._env = env
        self.observation: Any = None
        self.info: dict[str, Any] = {}
        self.reward = 0.0
        self.steps = 0
        self.terminated = False
        self.truncated = False

    async def start(self, payload: dict[str, Any]) -> ScoredEnv:
        self.observation, self.info = await self._env.reset(seed=None, options={"task": payload})
        return self

    async def step(self, action: str):
        obs, reward, terminated, truncated, info = await self._env.step(action)
        self.observation, self.info = obs, info
        self.reward += float(reward)
        self.steps += 1
        self.terminated = self.terminated or bool(terminated)
        self.truncated = self.truncated or bool(truncated)
        return obs, reward, terminated, truncated, info

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


def _overrides(task: Task) -> dict[str, Any]:
    """Evaluation tasks decode greedily whatever the agent asks (as in ``single_agent``)."""
    out: dict[str, Any] = {}
    if task.meta.get("greedy"):
        out.update(temperature=0.0, top_p=1.0)
    if task.meta.get("max_tokens"):
        out["max_tokens"] = int(task.meta["max_tokens"])
    return out


class OpenAIAgentWorkflow:
    """The workflow object: one per node (it owns the node's endpoint, see ``aclose``)."""

    def __init__(self) -> None:
        self.gateway = AgentGateway()
        self._agents: dict[str, tuple[Any, bool]] = {}

    async def aclose(self) -> None:
        await self.gateway.aclose()

    def agent(self, ref: str) -> tuple[Any, bool]:
        if ref not in self._agents:
            self._agents[ref] = load_agent(ref)
        return self._agents[ref]

    async def __call__(
        self,
        task: Task,
        policies: Mapping[str, RolePolicy],
        make_env: EnvFactory,
        *,
        agent: str | None = None,
        max_turns: int = 1,
        max_total_tokens: int = 4096,
        request_timeout_s: float = 600.0,
        **env_kwargs: Any,
    ) -> Episode:
        if not agent:
            raise WorkflowError(f"the openai_agent workflow needs workflow.agent = {AGENT_FORMAT}")
        try:
            import openai
        except ImportError:
            raise WorkflowError(
                "the openai_agent workflow needs the openai package: pip install 'astraflow[openai]'"
            ) from None
        fn, wants_env = self.agent(agent)
        started = time.perf_counter()
        base_url = await self.gateway.start()
        calls = EpisodeCalls(policies, max_total_tokens)
        key = self.gateway.open(AgentSession(policies, calls, _overrides(task)))
        env_kw = {"max_turns": max_turns, **env_kwargs}
        scored: ScoredEnv | None = None
        envs: list[Any] = []
        try:
            client = openai.AsyncOpenAI(
                base_url=base_url,
                api_key=key,
                http_client=self.gateway.http_client(),
                max_retries=0,
                timeout=request_timeout_s,
            )
            client.set_reward = calls.set_reward  # per-call rewards (see the module doc)
            if wants_env:
                envs.append(await make_env(task.env, env_kw))
                scored = await ScoredEnv(envs[-1]).start(dict(task.payload))
            try:
                if scored is not None:
                    result = await fn(client, dict(task.payload), env=scored)
                else:
                    result = await fn(client, dict(task.payload))
            except Exception:
                if not (calls.truncated and calls.roles()):
                    raise
                # out of room, the agent could not finish: keep what it did (see the module doc)
                result = None if scored is not None else 0.0
            # no call may land after the episode is assembled
            self.gateway.close_session(key)
            roles = calls.roles()
            if not roles:
                raise WorkflowError(f"agent {agent!r} made no model call in this episode")
            if isinstance(result, str):
                if scored is None:
                    envs.append(await make_env(task.env, env_kw))
                    scored = await ScoredEnv(envs[-1]).start(dict(task.payload))
                if not scored.done:
                    await scored.step(result)
            rewards = calls.with_final_rewards(_rewards(agent, result, scored, roles))
        finally:
            self.gateway.close_session(key)
            for env in envs:
                await env.close()
        if calls.truncated:
            finish = "length"
        elif calls.invalid_tool_calls:
            finish = "invalid_tool_call"
        elif scored is not None and scored.truncated:
            finish = "truncated"
        elif scored is not None and not scored.done and result is None:
            finish = "turn_limit"
        else:
            finish = "terminated"
        trajectories = calls.trajectories()
        return Episode(
            task_id=task.id,
            trajectories=trajectories,
            rewards=rewards,
            finish_reason=finish,
            info=_jsonable(scored.info) if scored is not None else {},
            metrics={
                "wall_s": time.perf_counter() - started,
                "calls": float(calls.calls),
                "turns": float(sum(t.num_turns for t in trajectories)),
                "tokens": float(sum(len(t.tokens) for t in trajectories)),
                "env_steps": float(scored.steps if scored is not None else 0),
                "tool_calls": float(calls.tool_calls),
                "invalid_tool_calls": float(calls.invalid_tool_calls),
            },
        )


def _rewards(
    agent: str, result: Any, scored: ScoredEnv | None, roles: list[str]
) -> dict[str, float]:
    if isinstance(result, bool | int | float):
        return {role: float(result) for role in roles}
    if isinstance(result, Mapping):
        missing = [r for r in roles if r not in result]
        if missing:
            raise WorkflowError(
                f"agent {agent!r} returned rewards for {sorted(result)} but roles {missing} made "
                "calls too; give every calling role a reward"
            )
        try:
            return {role: float(result[role]) for role in roles}
        except (TypeError, ValueError) as exc:
            raise WorkflowError(f"agent {agent!r} returned a non-numeric reward: {exc}") from None
    if isinstance(result, str) or result is None:
        if scored is None:
            raise WorkflowError(
                f"agent {agent!r} returned None and took no env: return a reward (a number), a "
                "final answer (a string, scored by the task's env), or take an `env` parameter"
            )
        return {role: scored.reward for role in roles}
    raise WorkflowError(
        f"agent {agent!r} returned {type(result).__name__}; expected a number, a mapping role -> "
        "number, a string (final answer) or None (rewards from env steps)"
    )


def spec() -> WorkflowSpec:
    """A fresh workflow object (its endpoint belongs to the node that discovers it)."""
    return WorkflowSpec(
        "openai_agent",
        OpenAIAgentWorkflow(),
        (),
        "Agent code written against the openai SDK; its calls become the roles' trajectories",
    )
