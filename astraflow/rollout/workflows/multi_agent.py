"""Workflows with several roles, each possibly served by a different policy.

``solve_verify``: a solver answers (up to ``max_turns`` tries in a multi-turn env, each answer an
env step: with ``[tasks.env_latency]`` a slow tool call); a verifier judges whether the final answer
is correct, its verdict checked by a tool of its own when ``verifier_tool_env`` names one. The
solver's reward is correctness (any try right; or, with ``solver_reward = "verified"``, the
verifier's acceptance); the verifier's reward is judgment accuracy. ``plan_execute``: a planner writes a short plan, an executor
acts in the env (possibly over several turns) with the plan in its context; both share the env's
reward. Every role's sequence is bounded by ``min(max_total_tokens, engine context - 1)``
(``workflows.budget``); an episode whose role runs out ends with ``finish_reason = "length"``,
scored by what was played. Each role's trajectory holds only its own generated tokens in the loss mask: the other
role's text is context. Env calls are awaited (see ``workflows.base``): none blocks the node's loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from astraflow.errors import AstraFlowError
from astraflow.protocol import Episode, Task
from astraflow.rollout.workflows import budget
from astraflow.rollout.workflows.base import EnvFactory, RolePolicy, WorkflowError, WorkflowSpec
from astraflow.rollout.workflows.single_agent import TurnRecorder, _jsonable, sampling_for
from astraflow.rollout.workflows.tokens import ChatRenderer


def _require(policies: Mapping[str, RolePolicy], roles: tuple[str, ...], name: str) -> None:
    missing = [r for r in roles if r not in policies]
    if missing:
        raise WorkflowError(f"{name} needs roles {list(roles)}; missing {missing}")


class OutOfContext(AstraFlowError):
    """A role's sequence has no room left to generate (see ``workflows.budget``)."""


async def _generate(
    policy: RolePolicy,
    task: Task,
    rec: TurnRecorder,
    limit: int,
    max_tokens: int | None = None,
):
    """One generation of ``policy`` after ``rec``'s tokens, cut to the room left in ``limit``;
    returns the :class:`Generation` and its text."""
    if budget.room(limit, rec.tokens) <= 0:
        raise OutOfContext(rec.role)
    params = sampling_for(task, policy)
    if max_tokens:
        params = replace(params, max_tokens=max_tokens)
    (gen,) = await policy.engine.generate(rec.tokens, budget.capped(params, limit, rec.tokens))
    rec.add_generated(gen.token_ids, gen.logprobs, gen.version)
    return gen, policy.tokenizer.decode(gen.token_ids, skip_special_tokens=True)


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
    verifier_tool_env: str | None = None,
    max_turns: int = 1,
    max_total_tokens: int = 4096,
    **env_kwargs: Any,
) -> Episode:
    """``max_turns``: the solver's tries (the env's feedback after a wrong one is context, not
    trained on); the verifier judges the last answer. ``verifier_tool_env``: an env id the
    verdict passes through, built by the node's env factory like the solver's (so
    ``[tasks.env_latency]`` delays it too, from a delay stream of its own): reset on the verify
    prompt with the right verdict (``accept`` or ``reject``) as its answer and stepped with the
    verdict text, its reward is the verifier's (``astraflow/Math-v0`` grades the digit verdicts
    exactly). Without it the verdict is scored in the workflow, with no tool call."""
    _require(policies, ("solver", "verifier"), "solve_verify")
    if solver_reward not in ("correct", "verified"):
        raise WorkflowError(f"solver_reward must be 'correct' or 'verified', got {solver_reward!r}")
    if max_turns < 1:
        raise WorkflowError(f"solve_verify needs max_turns >= 1, got {max_turns}")
    solver, verifier = policies["solver"], policies["verifier"]
    env = await make_env(task.env, {"max_turns": max_turns, **env_kwargs})
    t_start = time.perf_counter()
    tool_s = 0.0
    try:
        obs, _ = await env.reset(options={"task": task.payload})
        renderer = ChatRenderer(solver.tokenizer)
        s_rec = TurnRecorder("solver", renderer.prompt_ids(obs))
        question = str(task.payload.get("question", obs))
        correct, answer, verdict, finish = False, "", None, "terminated"
        tool_reward: float | None = None
        v_rec: TurnRecorder | None = None
        try:
            limit = budget.context_limit(solver.engine, max_total_tokens)
            for _turn in range(max_turns):
                gen, answer = await _generate(solver, task, s_rec, limit)
                t0 = time.perf_counter()
                obs, reward, terminated, truncated, info = await env.step(answer)
                tool_s += time.perf_counter() - t0
                correct = correct or bool(info.get("success", reward > 0))
                if terminated or truncated:
                    finish = "terminated" if terminated else "truncated"
                    break
                feedback = renderer.observation_ids(obs, gen.token_ids)
                if not budget.fits(limit, s_rec.tokens, feedback):
                    raise OutOfContext(s_rec.role)  # no room for another try: judge this one
                s_rec.add_context(feedback)
            else:
                finish = "turn_limit"
            prompt = verify_template.format(question=question, answer=answer.strip())
            v_rec = TurnRecorder("verifier", ChatRenderer(verifier.tokenizer).prompt_ids(prompt))
            _, verdict_text = await _generate(
                verifier,
                task,
                v_rec,
                budget.context_limit(verifier.engine, max_total_tokens),
                verifier_max_tokens,
            )
            verdict = parse_verdict(verdict_text, accept, reject)
            if verifier_tool_env is not None:
                t0 = time.perf_counter()
                tool_reward = await _check_verdict(
                    make_env, verifier_tool_env, prompt, accept if correct else reject, verdict_text
                )
                tool_s += time.perf_counter() - t0
        except OutOfContext:
            finish = budget.LENGTH
        if v_rec is None:  # the solver never answered: the verifier's prompt, nothing judged
            prompt = verify_template.format(question=question, answer="")
            v_rec = TurnRecorder("verifier", ChatRenderer(verifier.tokenizer).prompt_ids(prompt))
        judged_right = verdict is not None and verdict == correct
        rewards = {
            "solver": float(correct if solver_reward == "correct" else bool(verdict)),
            "verifier": float(judged_right) if tool_reward is None else tool_reward,
        }
        return Episode(
            task_id=task.id,
            trajectories=[s_rec.trajectory(), v_rec.trajectory()],
            rewards=rewards,
            finish_reason=finish,
            info=_jsonable(
                {
                    "correct": correct,
                    "verdict": verdict,
                    "verdict_valid": verdict is not None,
                    "success": correct,
                    "answer": answer[:200],
                }
            ),
            metrics={
                "wall_s": time.perf_counter() - t_start,
                "env_s": tool_s,
                "turns": float(s_rec.turns),
            },
        )
    finally:
        await env.close()


async def _check_verdict(
    make_env: EnvFactory, env_id: str, prompt: str, expected: str, verdict_text: str
) -> float:
    """The verifier's tool call: one step of ``env_id`` grading ``verdict_text`` against the
    right verdict ``expected``; its reward, clipped to [0, 1] (a judgment is right or wrong)."""
    tool = await make_env(env_id, {"max_turns": 1})
    try:
        await tool.reset(options={"task": {"question": prompt, "answer": expected}})
        _, reward, _, _, _ = await tool.step(verdict_text)
        return min(1.0, max(0.0, float(reward)))
    finally:
        await tool.close()


async def plan_execute(
    task: Task,
    policies: Mapping[str, RolePolicy],
    make_env: EnvFactory,
    *,
    plan_template: str = "{observation}",
    execute_template: str = "{observation}\n{plan}",
    plan_max_tokens: int = 8,
    max_turns: int = 1,
    max_total_tokens: int = 4096,
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
        total, finish, plan = 0.0, "turn_limit", ""
        e_rec: TurnRecorder | None = None
        try:
            _, plan = await _generate(
                planner,
                task,
                p_rec,
                budget.context_limit(planner.engine, max_total_tokens),
                plan_max_tokens,
            )
            plan = plan.strip()
            renderer = ChatRenderer(executor.tokenizer)
            e_rec = TurnRecorder(
                "executor",
                renderer.prompt_ids(execute_template.format(observation=obs, plan=plan)),
            )
            limit = budget.context_limit(executor.engine, max_total_tokens)
            for _ in range(max_turns):
                gen, text = await _generate(executor, task, e_rec, limit)
                obs, reward, terminated, truncated, info = await env.step(text)
                total += reward
                if terminated or truncated:
                    finish = "terminated" if terminated else "truncated"
                    break
                feedback = renderer.observation_ids(obs, gen.token_ids)
                if not budget.fits(limit, e_rec.tokens, feedback):
                    raise OutOfContext(e_rec.role)  # no room to act on it: end, as played
                e_rec.add_context(feedback)
        except OutOfContext:
            finish = budget.LENGTH
        if e_rec is None:  # the planner ran out: the executor's prompt, never acted on
            opening = execute_template.format(observation=obs, plan="")
            e_rec = TurnRecorder("executor", ChatRenderer(executor.tokenizer).prompt_ids(opening))
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
