"""`astraflow eval agentbench` runs episodes through the training path: the single_agent workflow,
an engine, and envs made by the EnvRunner (env calls off the event loop). Real SQLite, real sandbox.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from agentbench_helpers import need_data
from astraflow.envs import default_registry
from astraflow.envs.agentbench.dbbench.env import AgentBenchDBEnv
from astraflow.envs.agentbench.oracle import OracleEpisode
from astraflow.envs.agentbench.status import TaskSkipped

from astraflow.protocol import Task
from astraflow.rollout.engines.byte_tokenizer import ByteTokenizer
from astraflow.rollout.engines.scripted import ScriptedEngine
from astraflow.rollout.env_runner import EnvRunner
from astraflow.rollout.evaluation.agentbench import (
    EvalConfig,
    evaluate,
    oracle_agent,
)
from astraflow.rollout.evaluation.agents import ScriptedAgent
from astraflow.rollout.evaluation.episodes import generated_texts, run_tasks
from astraflow.rollout.workflows import WorkflowSpec, default_workflows
from astraflow.rollout.workflows.single_agent import single_agent


def _spy_registry(calls: list):
    """The installed workflows, with single_agent wrapped to record every episode it returns."""
    registry = default_workflows()
    real = registry.get("single_agent")

    async def spy(task, policies, make_env, **kwargs):
        episode = await single_agent(task, policies, make_env, **kwargs)
        calls.append((task, policies, kwargs, episode))
        return episode

    registry.add(WorkflowSpec("single_agent", spy, real.roles, real.description))
    return registry


def test_oracle_episodes_are_single_agent_trajectories(monkeypatch):
    data = need_data()
    calls: list = []
    made: list[str] = []
    resets: list[bool] = []
    real_make, real_reset = EnvRunner.make, AgentBenchDBEnv.reset

    async def make(self, env_id, kwargs):
        made.append(env_id)
        return await real_make(self, env_id, kwargs)

    def reset(self, **kw):
        resets.append(threading.current_thread() is threading.main_thread())
        return real_reset(self, **kw)

    monkeypatch.setattr(EnvRunner, "make", make)
    monkeypatch.setattr(AgentBenchDBEnv, "reset", reset)
    config = EvalConfig(tasks=("dbbench",), data_dir=str(data), concurrency=4)
    report = asyncio.run(evaluate(oracle_agent(), config, workflows=_spy_registry(calls)))

    samples = report["samples"]["dbbench"]
    assert report["meta"]["workflow"] == "single_agent"
    assert report["tasks"]["dbbench"]["passed"] == len(samples) == len(calls) == 60
    # every env came from the runner and was reset off the event loop's thread
    assert made == ["astraflow/AgentBench-DB-v0"] * 60 and resets == [False] * 60
    by_id = {s["sample_id"]: s for s in samples}
    tok = ByteTokenizer()
    for task, policies, kwargs, episode in calls:
        assert kwargs["max_turns"] == 16  # dbbench's own round limit (15 operations + answer)
        assert episode.finish_reason == "terminated" and episode.rewards == {"agent": 1.0}
        (traj,) = episode.trajectories
        replies = generated_texts(traj, tok)
        # the oracle's replies are the generated tokens of the workflow's trajectory, EOS-ended
        oracle = OracleEpisode("dbbench", task.payload)
        expected = [oracle.reply("") for _ in replies]
        assert replies == expected and traj.num_turns == len(replies)
        assert isinstance(policies["agent"].engine, ScriptedEngine)
        # one scripted engine per episode, asked once per turn
        assert policies["agent"].engine.calls == len(replies)
        generated = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
        assert generated.count(tok.eos_token_id) == len(replies)
        assert {v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m} == {0}
        sample = by_id[task.payload["id"]]
        assert sample["replies"] == replies and sample["turns"] == traj.num_turns
        assert sample["finish_reason"] == "terminated"


def test_context_overflow_is_agentbench_context_limit():
    data = need_data()
    agent = oracle_agent()
    agent.max_total_tokens = 64  # the prompt alone is longer: no room to generate
    config = EvalConfig(tasks=("dbbench",), data_dir=str(data), limit=2)
    report = asyncio.run(evaluate(agent, config))
    for sample in report["samples"]["dbbench"]:
        assert sample["status"] == "agent context limit" and not sample["passed"]
        assert sample["finish_reason"] == "length" and sample["turns"] == 0


def test_a_sample_the_sandbox_cannot_run_is_skipped_through_the_runner():
    from astraflow.envs.agentbench.os.sandbox import SandboxError, select_sandbox

    try:
        sandbox = select_sandbox("auto")
    except SandboxError as exc:
        pytest.skip(f"no OS sandbox on this machine: {exc}")
    payload = {
        "id": "needs-net",
        "description": "fetch a page",
        "init": [],
        "start": None,
        "match": {"answer": "x", "strip": True},
        "check": None,
        "requires": ["network", "users"],
    }
    if all(getattr(sandbox.capabilities, r) for r in payload["requires"]):
        pytest.skip("this sandbox offers network and users")
    task = Task(env="astraflow/AgentBench-OS-v0", payload=payload, meta={"family": "os"})
    registry = default_registry()
    runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1)
    agent = ScriptedAgent("probe", lambda task: lambda obs: "Act: finish")

    async def go():
        spec = default_workflows().get("single_agent")
        return await run_tasks(
            [task],
            spec,
            agent.policies,
            lambda task: runner.make,
            workflow_kwargs={"sandbox": sandbox},
        )

    try:
        (outcome,) = asyncio.run(go())
    finally:
        runner.shutdown()
    assert isinstance(outcome.error, TaskSkipped) and "needs network" in str(outcome.error)


def _context_runs_out_after_first_reply(payload: dict):
    """Run ``payload`` with the oracle and a token budget that ends after its first reply."""
    from astraflow.rollout.evaluation.agentbench import ScoredEnd, family, sample_result
    from astraflow.rollout.workflows.tokens import ChatRenderer

    env = AgentBenchDBEnv()
    obs, _ = env.reset(options={"task": payload})
    env.close()
    tok = ByteTokenizer()
    first = OracleEpisode("dbbench", payload).reply(obs)
    budget = len(ChatRenderer(tok).prompt_ids(obs)) + len(tok.encode(first)) + 1
    fam = family("dbbench")
    task = Task(env=fam.env_id, payload=payload, meta={"family": "dbbench"})
    registry = default_registry()
    runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1)

    async def go():
        return await run_tasks(
            [task],
            default_workflows().get("single_agent"),
            oracle_agent().policies,
            lambda task: ScoredEnd(runner),
            workflow_kwargs={"max_turns": fam.max_turns, "max_total_tokens": budget},
        )

    try:
        (outcome,) = asyncio.run(go())
    finally:
        runner.shutdown()
    return sample_result(fam, outcome)


def test_a_modification_is_judged_by_its_table_when_the_context_runs_out():
    """AgentBench hashes the table however a modification sample ends, context limit included."""
    from astraflow.envs.agentbench.data import load_dbbench

    data = need_data()
    payloads = load_dbbench(data, "dev")
    insert = next(p for p in payloads if p["type"] == "INSERT")
    res = _context_runs_out_after_first_reply(insert)
    assert (res.status, res.finish_reason, res.turns) == ("agent context limit", "length", 1)
    assert res.passed and res.answer == insert["answer_md5"]
