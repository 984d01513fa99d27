"""Workflows on a real engine (the built-in tiny model) and real envs."""

from __future__ import annotations

import asyncio

import pytest

from astraflow.protocol import Task
from astraflow.rollout.engines import SamplingParams, make_engine
from astraflow.rollout.env_runner import EnvRunner
from astraflow.rollout.workflows import RolePolicy, WorkflowError, default_workflows
from astraflow.rollout.workflows.tokens import ChatRenderer
from envs import default_registry
from tasks.catalog import load_task_set


@pytest.fixture(scope="module")
def engine():
    from astraflow.models import resolve_model

    eng = make_engine("transformers", resolve_model("builtin:tiny-arith"), device="cpu", seed=0)
    yield eng
    asyncio.run(eng.close())


@pytest.fixture(scope="module")
def registry():
    return default_registry()


@pytest.fixture(scope="module")
def envs(registry):
    """The async env factory workflows get on a node: ``await envs(env_id, kwargs)``."""
    runner = EnvRunner(lambda env_id, kwargs: registry.make(env_id, **kwargs), workers=4)
    yield runner.make
    runner.shutdown()


def _tasks(n, env="astraflow/Math-v0"):
    return [Task(env=env, payload=p, group_size=1) for p in load_task_set("arith", "test", limit=n)]


def _segments(mask):
    segs, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            segs.append((start, i))
            start = None
    return segs


def test_single_agent_records_generated_tokens_only(engine, envs, registry):
    wf = default_workflows().get("single_agent")
    policy = RolePolicy("policy", engine, SamplingParams(temperature=1.0, max_tokens=6))
    tasks = _tasks(8)

    async def run():
        return await asyncio.gather(*(wf.fn(t, {"agent": policy}, envs) for t in tasks))

    episodes = asyncio.run(run())
    renderer = ChatRenderer(engine.tokenizer)
    env = registry.make("astraflow/Math-v0")
    for task, ep in zip(tasks, episodes, strict=True):
        (traj,) = ep.trajectories
        prompt = renderer.prompt_ids(task.payload["question"])
        assert traj.tokens[: len(prompt)] == prompt
        assert traj.prompt_length == len(prompt)
        assert _segments(traj.loss_mask) == [(len(prompt), len(traj.tokens))]
        gen = traj.tokens[len(prompt) :]
        assert all(lp <= 0.0 for lp in traj.logprobs[len(prompt) :])
        assert set(traj.versions[len(prompt) :]) == {engine.version}
        assert set(traj.versions[: len(prompt)]) == {-1}
        # the reward is the env's score of exactly the generated text
        env.reset(options={"task": task.payload})
        text = engine.tokenizer.decode(gen, skip_special_tokens=True)
        _, reward, *_ = env.step(text)
        assert ep.rewards == {"agent": reward}


def test_multi_turn_masks_observations(engine, envs):
    wf = default_workflows().get("single_agent")
    policy = RolePolicy("policy", engine, SamplingParams(temperature=1.0, max_tokens=4))
    task = Task(env="astraflow/MathMultiTurn-v0", payload={"question": "1000*1000", "answer": "-1"})
    ep = asyncio.run(wf.fn(task, {"agent": policy}, envs, max_turns=3))
    (traj,) = ep.trajectories
    segs = _segments(traj.loss_mask)
    assert traj.num_turns == 3 and len(segs) == 3  # wrong answer every turn -> three generations
    for (_, end), (start, _) in zip(segs, segs[1:], strict=False):
        between = engine.tokenizer.decode(traj.tokens[end:start])
        assert "<|user|>" in between  # the env's feedback is context, not trained on
    assert ep.finish_reason in ("truncated", "turn_limit")


def test_solve_verify_splits_roles(engine, envs):
    wf = default_workflows().get("solve_verify")
    solver = RolePolicy("solver", engine, SamplingParams(temperature=1.0, max_tokens=4))
    verifier = RolePolicy("verifier", engine, SamplingParams(temperature=1.0, max_tokens=2))
    (task,) = _tasks(1)
    ep = asyncio.run(wf.fn(task, {"solver": solver, "verifier": verifier}, envs))
    s, v = ep.trajectories
    assert (s.role, v.role) == ("solver", "verifier")
    answer = engine.tokenizer.decode(s.tokens[s.prompt_length :], skip_special_tokens=True).strip()
    v_prompt = engine.tokenizer.decode(v.tokens[: v.prompt_length])
    assert (
        f"{task.payload['question']}={answer}?" in v_prompt
    )  # the solver's text is the verifier's context
    assert sum(v.loss_mask) == len(v.tokens) - v.prompt_length <= 2
    correct = ep.info["correct"]
    assert ep.rewards["solver"] == float(correct)
    assert ep.rewards["verifier"] == float(
        ep.info["verdict"] is not None and ep.info["verdict"] == correct
    )


def test_plan_execute_shares_reward(engine, envs):
    wf = default_workflows().get("plan_execute")
    p = RolePolicy("p", engine, SamplingParams(temperature=1.0, max_tokens=3))
    (task,) = _tasks(1)
    ep = asyncio.run(wf.fn(task, {"planner": p, "executor": p}, envs))
    assert [t.role for t in ep.trajectories] == ["planner", "executor"]
    assert ep.rewards["planner"] == ep.rewards["executor"]


def test_missing_role_is_a_clear_error(engine, envs):
    wf = default_workflows().get("solve_verify")
    p = RolePolicy("p", engine, SamplingParams())
    with pytest.raises(WorkflowError, match="missing \\['verifier'\\]"):
        asyncio.run(wf.fn(_tasks(1)[0], {"solver": p}, envs))


def test_unknown_workflow_suggests():
    with pytest.raises(WorkflowError, match="did you mean single_agent"):
        default_workflows().get("single_agnet")


def test_greedy_eval_tasks_are_deterministic(engine, envs):
    wf = default_workflows().get("single_agent")
    policy = RolePolicy("policy", engine, SamplingParams(temperature=1.0, max_tokens=6))
    (task,) = _tasks(1)
    task = task.model_copy(update={"meta": {"eval": True, "greedy": True}})
    a = asyncio.run(wf.fn(task, {"agent": policy}, envs))
    b = asyncio.run(wf.fn(task, {"agent": policy}, envs))
    assert a.trajectories[0].tokens == b.trajectories[0].tokens
