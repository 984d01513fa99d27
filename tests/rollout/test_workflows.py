"""Workflows on a real engine (the built-in tiny model) and real envs."""

from __future__ import annotations

import asyncio

import pytest
from astraflow.envs import default_registry
from astraflow.tasks.catalog import load_task_set

from astraflow.protocol import Task
from astraflow.rollout.engines import SamplingParams, make_engine
from astraflow.rollout.env_runner import EnvRunner
from astraflow.rollout.workflows import RolePolicy, WorkflowError, default_workflows
from astraflow.rollout.workflows.tokens import ChatRenderer


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


def test_solve_verify_solver_tries_through_a_multi_turn_env(engine, envs):
    """``max_turns`` gives the solver several tries: each wrong answer gets the env's feedback as
    context (not trained on) and another generation; the verifier judges the last answer."""
    wf = default_workflows().get("solve_verify")
    solver = RolePolicy("solver", engine, SamplingParams(temperature=1.0, max_tokens=4))
    verifier = RolePolicy("verifier", engine, SamplingParams(temperature=1.0, max_tokens=1))
    never = Task(
        env="astraflow/MathMultiTurn-v0", payload={"question": "1000*1000", "answer": "-1"}
    )
    ep = asyncio.run(
        wf.fn(never, {"solver": solver, "verifier": verifier}, envs, max_turns=3,
              verifier_max_tokens=1)
    )  # fmt: skip
    s, v = ep.trajectories
    segs = _segments(s.loss_mask)
    assert s.num_turns == 3 and len(segs) == 3, segs
    for (_, end), (start, _) in zip(segs, segs[1:], strict=False):
        assert "<|user|>" in engine.tokenizer.decode(s.tokens[end:start])  # feedback is context
    last = engine.tokenizer.decode(s.tokens[segs[-1][0] :], skip_special_tokens=True).strip()
    assert f"1000*1000={last}?" in engine.tokenizer.decode(v.tokens[: v.prompt_length])
    assert ep.rewards["solver"] == 0.0 and ep.info["correct"] is False
    assert ep.finish_reason in ("truncated", "turn_limit")
    assert ep.metrics["turns"] == 3.0


def test_solve_verify_checks_the_verdict_with_a_tool(engine, registry):
    """``verifier_tool_env``: the verdict is one more env call through the node's env factory
    (so ``[tasks.env_latency]`` delays it, from a stream of its own), graded against the right
    verdict; its reward is the verifier's."""
    from astraflow.envs.wrappers.latency import LatencyEnvFactory

    from astraflow.rollout.env_runner import EnvRunner

    built = []

    def make(env_id, kwargs):
        built.append(env_id)
        return registry.make(env_id, **kwargs)

    factory = LatencyEnvFactory(make, {"distribution": "fixed", "value_s": 0.001}, seed=0)
    wrapped = []

    def make_wrapped(env_id, kwargs):
        env = factory(env_id, kwargs)
        wrapped.append((env_id, env))
        return env

    runner = EnvRunner(make_wrapped, workers=2)
    wf = default_workflows().get("solve_verify")
    solver = RolePolicy("solver", engine, SamplingParams(temperature=1.0, max_tokens=4))
    verifier = RolePolicy("verifier", engine, SamplingParams(temperature=1.0, max_tokens=1))
    tasks = _tasks(6, env="astraflow/MathMultiTurn-v0")

    async def run():
        return await asyncio.gather(
            *(
                wf.fn(t, {"solver": solver, "verifier": verifier}, runner.make, max_turns=2,
                      verifier_max_tokens=1, verifier_tool_env="astraflow/Math-v0")
                for t in tasks
            )
        )  # fmt: skip

    try:
        episodes = asyncio.run(run())
    finally:
        runner.shutdown()
    assert built.count("astraflow/Math-v0") == len(tasks)  # one check per episode
    assert built.count("astraflow/MathMultiTurn-v0") == len(tasks)
    checks = [env for env_id, env in wrapped if env_id == "astraflow/Math-v0"]
    assert [env.calls for env in checks] == [1] * len(tasks)  # the check: one delayed step
    for ep in episodes:
        right = ep.info["verdict"] is not None and ep.info["verdict"] == ep.info["correct"]
        assert ep.rewards["verifier"] == float(right)  # Math-v0 grades the digit verdicts exactly
        assert ep.metrics["env_s"] > 0


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


def test_long_multi_turn_episodes_end_at_the_context(engine, envs):
    """MathMultiTurn-v0 with 8 tries on the tiny policy (256-token context): an episode whose
    history reaches the context ends with ``length`` and keeps its reward; none sends the engine a
    prompt it must refuse (which would make an error episode and bias the group)."""
    assert engine.max_context == 256
    wf = default_workflows().get("single_agent")
    policy = RolePolicy("policy", engine, SamplingParams(temperature=1.0, max_tokens=12))
    wrong = {"question": "1000*1000", "answer": "-1"}  # never solved: every episode runs long
    tasks = [Task(env="astraflow/MathMultiTurn-v0", payload=wrong) for _ in range(4)]
    tasks += _tasks(4, env="astraflow/MathMultiTurn-v0")

    async def run():
        return await asyncio.gather(
            *(wf.fn(t, {"agent": policy}, envs, max_turns=8) for t in tasks)
        )

    episodes = asyncio.run(run())
    hit = [ep for ep in episodes if ep.finish_reason == "length"]
    assert len(hit) >= 4, [ep.finish_reason for ep in episodes]
    for ep in episodes:
        assert ep.finish_reason in ("terminated", "length"), ep.finish_reason
        (traj,) = ep.trajectories
        assert len(traj.tokens) <= engine.max_context - 1
    for ep in hit:
        (traj,) = ep.trajectories
        # the feedback that would not fit is skipped: the sequence ends on generated tokens
        assert traj.loss_mask[-1] == 1 and traj.num_turns < 8
        assert ep.rewards["agent"] == 0.0 and not ep.info.get("success")
    # the recipe's max_total_tokens is the bound when it is the smaller one
    # (40 tokens: less than the prompt plus one feedback message, so the budget ends the episode
    # before the env can, whatever the sampled answer lengths)
    short = asyncio.run(wf.fn(tasks[0], {"agent": policy}, envs, max_turns=8, max_total_tokens=40))
    assert short.finish_reason == "length" and len(short.trajectories[0].tokens) <= 40


def test_multi_role_workflows_end_at_the_context(engine, envs):
    p = RolePolicy("p", engine, SamplingParams(temperature=1.0, max_tokens=12))
    wrong = {"question": "1000*1000", "answer": "-1"}
    task = Task(env="astraflow/MathMultiTurn-v0", payload=wrong)
    plan = default_workflows().get("plan_execute")
    ep = asyncio.run(plan.fn(task, {"planner": p, "executor": p}, envs, max_turns=30))
    assert ep.finish_reason == "length"
    assert all(len(t.tokens) <= engine.max_context - 1 for t in ep.trajectories)
    # a bound smaller than the verifier's prompt: the solver answers, the verifier cannot
    sv = default_workflows().get("solve_verify")
    (task,) = _tasks(1)
    solver, verifier = p, RolePolicy("v", engine, SamplingParams(max_tokens=2))
    ep = asyncio.run(
        sv.fn(
            task,
            {"solver": solver, "verifier": verifier},
            envs,
            verify_template="{question}={answer}? " + "check carefully " * 40,
            max_total_tokens=60,
        )
    )
    assert ep.finish_reason == "length"
    s, v = ep.trajectories
    assert sum(s.loss_mask) > 0 and sum(v.loss_mask) == 0
    assert ep.rewards["verifier"] == 0.0
