"""Workflows with several roles, each possibly served by a different policy.

``solve_verify``: a solver answers; a verifier judges whether that answer is correct. The solver's
reward is correctness (or, with ``solver_reward = "verified"``, the verifier's acceptance); the
verifier's reward is judgment accuracy. ``plan_execute``: a planner writes a short plan, an executor
acts in the env (possibly over several turns) with the plan in its context; both share the env's
reward. Each role's trajectory holds only its own generated tokens in the loss mask: the other
role's text is context. Env calls are awaited (see ``workflows.base``): none blocks the node's loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from astraflow.protocol import Episode, Task
from astraflow.rollout.workflows.base import EnvFactory, RolePolicy, WorkflowError, WorkflowSpec
from astraflow.rollout.workflows.single_agent import TurnRecorder, _jsonable, sampling_for
from astraflow.rollout.workflows.tokens import ChatRenderer


def _require(policies: Mapping[str, RolePolicy], roles: tuple[str, ...], name: str) -> None:
    missing = [r for r in roles if r not in policies]
    if missing:
        raise WorkflowError(f"{name} needs roles {list(roles)}; missing {missing}")


async def _generate(
    policy: RolePolicy, task: Task, rec: TurnRecorder, max_tokens: int | None = None
) -> str:
    params = sampling_for(task, policy)
    if max_tokens:
        params = replace(params, max_tokens=max_tokens)
    (gen,) = await policy.engine.generate(rec.tokens, params)
    rec.add_generated(gen.token_ids, gen.logprobs, gen.version)
    return policy.tokenizer.decode(gen.token_ids, skip_special_tokens=True)


def parse_verdict(text: str, accept: str, reject: str) -> bool | None:
    """The verifier's verdict: True (accept), False (reject) or None (neither, counted as wrong)."""
    t = text.strip().lower()
    if t.startswith(accept.lower()):
        return True
    if t.startswith(reject.lower()):
        return False
    return None


async def solve_verify(
    task: Task,
    policies: Mapping[str, RolePolicy],
    make_env: EnvFactory,
    *,
    verify_template: str = "{question}={answer}?",
    accept: str = "1",
    reject: str = "0",
    solver_reward: str = "correct",
    verifier_max_tokens: int = 2,
    max_turns: int = 1,
    **env_kwargs: Any,
) -> Episode:
    _require(policies, ("solver", "verifier"), "solve_verify")
    if solver_reward not in ("correct", "verified"):
        raise WorkflowError(f"solver_reward must be 'correct' or 'verified', got {solver_reward!r}")
    solver, verifier = policies["solver"], policies["verifier"]
    env = await make_env(task.env, {"max_turns": 1, **env_kwargs})
    t_start = time.perf_counter()
    try:
        obs, _ = await env.reset(options={"task": task.payload})
        s_rec = TurnRecorder("solver", ChatRenderer(solver.tokenizer).prompt_ids(obs))
        answer = await _generate(solver, task, s_rec)
        _, reward, _, _, info = await env.step(answer)
        correct = bool(info.get("success", reward > 0))
        question = str(task.payload.get("question", obs))
        prompt = verify_template.format(question=question, answer=answer.strip())
        v_rec = TurnRecorder("verifier", ChatRenderer(verifier.tokenizer).prompt_ids(prompt))
        verdict_text = await _generate(verifier, task, v_rec, verifier_max_tokens)
        verdict = parse_verdict(verdict_text, accept, reject)
        judged_right = verdict is not None and verdict == correct
        rewards = {
            "solver": float(correct if solver_reward == "correct" else bool(verdict)),
            "verifier": float(judged_right),
        }
        return Episode(
            task_id=task.id,
            trajectories=[s_rec.trajectory(), v_rec.trajectory()],
            rewards=rewards,
            finish_reason="terminated",
            info=_jsonable(
                {
                    "correct": correct,
                    "verdict": verdict,
                    "verdict_valid": verdict is not None,
                    "success": correct,
                    "answer": answer[:200],
                }
            ),
            metrics={"wall_s": time.perf_counter() - t_start},
        )
    finally:
        await env.close()


async def plan_execute(
    task: Task,
    policies: Mapping[str, RolePolicy],
    make_env: EnvFactory,
    *,
    plan_template: str = "{observation}",
    execute_template: str = "{observation}\n{plan}",
    plan_max_tokens: int = 8,
    max_turns: int = 1,
    **env_kwargs: Any,
) -> Episode:
    _require(policies, ("planner", "executor"), "plan_execute")
    planner, executor = policies["planner"], policies["executor"]
    env = await make_env(task.env, {"max_turns": max_turns, **env_kwargs})
    t_start = time.perf_counter()
    try:
        obs, info = await env.reset(options={"task": task.payload})
        p_rec = TurnRecorder(
            "planner",
            ChatRenderer(planner.tokenizer).prompt_ids(plan_template.format(observation=obs)),
        )
        plan = (await _generate(planner, task, p_rec, plan_max_tokens)).strip()
        renderer = ChatRenderer(executor.tokenizer)
        e_rec = TurnRecorder(
            "executor", renderer.prompt_ids(execute_template.format(observation=obs, plan=plan))
        )
        total, finish = 0.0, "turn_limit"
        for _ in range(max_turns):
            params = sampling_for(task, executor)
            (gen,) = await executor.engine.generate(e_rec.tokens, params)
            e_rec.add_generated(gen.token_ids, gen.logprobs, gen.version)
            text = executor.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            obs, reward, terminated, truncated, info = await env.step(text)
            total += reward
            if terminated or truncated:
                finish = "terminated" if terminated else "truncated"
                break
            e_rec.add_context(renderer.observation_ids(obs, gen.token_ids))
        return Episode(
            task_id=task.id,
            trajectories=[p_rec.trajectory(), e_rec.trajectory()],
            rewards={"planner": total, "executor": total},
            finish_reason=finish,
            info=_jsonable({**info, "plan": plan[:200]}),
            metrics={"wall_s": time.perf_counter() - t_start},
        )
    finally:
        await env.close()


SPECS = [
    WorkflowSpec(
        "solve_verify",
        solve_verify,
        ("solver", "verifier"),
        "Solver answers, verifier judges; rewards: correctness and judgment accuracy",
    ),
    WorkflowSpec(
        "plan_execute",
        plan_execute,
        ("planner", "executor"),
        "Planner writes a plan, executor acts in the env with it; shared env reward",
    ),
]
