"""``single_agent``: the generic multi-turn loop of one policy over any registered env.

Env calls are awaited on the env the node's ``make_env`` returns (an ``AsyncEnv``), so a slow env
step (a sandbox run, a database query) never blocks other episodes on the node. An env whose reset
info carries ``messages`` (chat turns, e.g. AgentBench ALFWorld's one-shot dialogue) opens the
conversation with them instead of its observation as one user message.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from astraflow.protocol import Episode, Task, Trajectory
from astraflow.rollout.workflows.base import EnvFactory, RolePolicy, WorkflowError
from astraflow.rollout.workflows.tokens import ChatRenderer


class TurnRecorder:
    """Accumulates one role's token sequence with loss mask, log-probs and versions."""

    def __init__(self, role: str, prompt_ids: list[int]):
        self.role = role
        self.tokens = list(prompt_ids)
        self.loss_mask = [0] * len(prompt_ids)
        self.logprobs = [0.0] * len(prompt_ids)
        self.versions = [-1] * len(prompt_ids)
        self.turns = 0

    def add_generated(self, ids: list[int], logprobs: list[float], version: int) -> None:
        self.tokens += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += list(logprobs)
        self.versions += [version] * len(ids)
        self.turns += 1

    def add_context(self, ids: list[int]) -> None:
        self.tokens += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def trajectory(self) -> Trajectory:
        return Trajectory(
            role=self.role,
            tokens=self.tokens,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            versions=self.versions,
            num_turns=self.turns,
        )


def sampling_for(task: Task, policy: RolePolicy):
    """Eval tasks are greedy; training tasks use the policy's sampling settings."""
    params = policy.sampling
    if task.meta.get("greedy"):
        params = replace(params, temperature=0.0, top_p=1.0)
    if task.meta.get("max_tokens"):
        params = replace(params, max_tokens=int(task.meta["max_tokens"]))
    return replace(params, n=1)


async def single_agent(
    task: Task,
    policies: Mapping[str, RolePolicy],
    make_env: EnvFactory,
    *,
    max_turns: int = 1,
    max_total_tokens: int = 4096,
    system_prompt: str | None = None,
    **env_kwargs: Any,
) -> Episode:
    if "agent" not in policies:
        raise WorkflowError(f"single_agent needs the role 'agent'; got roles {sorted(policies)}")
    agent = policies["agent"]
    env = await make_env(task.env, {"max_turns": max_turns, **env_kwargs})
    started = time.perf_counter()
    gen_s = env_s = 0.0
    try:
        renderer = ChatRenderer(agent.tokenizer, system=system_prompt)
        t0 = time.perf_counter()
        obs, info = await env.reset(seed=None, options={"task": task.payload})
        env_s += time.perf_counter() - t0
        # An env may open with chat turns of its own (a benchmark's few-shot dialogue).
        rec = TurnRecorder("agent", renderer.prompt_ids(obs, info.get("messages")))
        total_reward = 0.0
        finish = "turn_limit"
        params = sampling_for(task, agent)
        for _turn in range(max_turns):
            budget = max_total_tokens - len(rec.tokens)
            if budget <= 0:
                finish = "length"
                break
            t0 = time.perf_counter()
            (gen,) = await agent.engine.generate(
                rec.tokens, replace(params, max_tokens=min(params.max_tokens, budget))
            )
            gen_s += time.perf_counter() - t0
            rec.add_generated(gen.token_ids, gen.logprobs, gen.version)
            text = agent.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, info = await env.step(text)
            env_s += time.perf_counter() - t0
            total_reward += reward
            if terminated:
                finish = "terminated"
                break
            if truncated:
                finish = "truncated"
                break
            rec.add_context(renderer.observation_ids(obs, gen.token_ids))
        return Episode(
            task_id=task.id,
            trajectories=[rec.trajectory()],
            rewards={"agent": total_reward},
            finish_reason=finish,
            info=_jsonable(info),
            metrics={
                "generate_s": gen_s,
                "env_s": env_s,
                "wall_s": time.perf_counter() - started,
                "turns": float(rec.turns),
                "tokens": float(len(rec.tokens)),
            },
        )
    finally:
        await env.close()


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    """Keep only msgpack-friendly values of an env's info dict."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(
            isinstance(x, (str, int, float, bool)) for x in v
        ):
            out[k] = list(v)[:256]
        elif isinstance(v, dict):
            out[k] = _jsonable(v)
        else:
            out[k] = str(v)[:1024]
    return out
