"""The optional env state contract (``state_dict`` / ``load_state_dict``): a multi-turn episode
saved between turns, carried as JSON and loaded into a fresh env (as a node that takes over a dead
node's episode does) answers the next turns exactly as the original env would have."""

from __future__ import annotations

import asyncio
import json

import pytest
from astraflow.envs.code.env import SAMPLE_TASKS, CodeMultiTurnEnv
from astraflow.envs.math.env import MathMultiTurnEnv
from astraflow.envs.registry import default_registry
from astraflow.envs.wrappers.latency import LatencyWrapper

from astraflow.rollout.env_runner import EnvRunner

TASK = {"id": "t1", "question": "2+3", "answer": "5"}


def _moved(env):
    """The env's state as another process would receive it: through JSON."""
    return json.loads(json.dumps(env.state_dict()))


def test_math_multi_turn_resumes_on_a_fresh_env():
    env = MathMultiTurnEnv(max_turns=3)
    env.reset(options={"task": TASK})
    obs, reward, terminated, truncated, info = env.step("4")
    assert (reward, terminated, truncated, info["turn"]) == (0.0, False, False, 1)
    fresh = MathMultiTurnEnv(max_turns=3)
    fresh.load_state_dict(_moved(env))
    assert fresh.render() == obs
    # the turn count carries over: two more wrong answers truncate at max_turns, not three
    _, _, terminated, truncated, info = fresh.step("7")
    assert (terminated, truncated, info["turn"]) == (False, False, 2)
    _, reward, terminated, truncated, info = fresh.step("5")
    assert (reward, terminated, info["success"], info["turn"]) == (1.0, True, True, 3)


def test_math_state_refuses_another_env_or_a_bad_turn():
    env = MathMultiTurnEnv(max_turns=3)
    env.reset(options={"task": TASK})
    state = _moved(env)
    with pytest.raises(ValueError, match="cannot load a state of 'MathMultiTurnEnv'"):
        CodeMultiTurnEnv().load_state_dict(state)
    with pytest.raises(ValueError, match="saved turn 9"):
        MathMultiTurnEnv(max_turns=3).load_state_dict({**state, "turn": 9})
    with pytest.raises(Exception, match="answer"):
        MathMultiTurnEnv(max_turns=3).load_state_dict({**state, "task": {"question": "1"}})


def test_code_multi_turn_state_keeps_task_and_turn():
    env = CodeMultiTurnEnv(max_turns=2)
    env.reset(options={"task": SAMPLE_TASKS[0]})
    env.turn = 1  # as after a failed first attempt (no sandbox needed to check the state)
    fresh = CodeMultiTurnEnv(max_turns=2)
    fresh.load_state_dict(_moved(env))
    assert fresh.task == SAMPLE_TASKS[0] and fresh.turn == 1
    assert fresh._plan is not None and fresh._plan.n_tests == env._plan.n_tests


def test_async_env_saves_through_the_latency_wrapper_and_not_for_other_envs():
    reg = default_registry()

    def make(env_id, kwargs):
        env = reg.make(env_id, **kwargs)
        return (
            LatencyWrapper(env, "fixed", value_s=0.0)
            if env_id.startswith("astraflow/Math")
            else env
        )

    async def main():
        runner = EnvRunner(make, workers=1, timeout_s=5)
        try:
            env = await runner.make("astraflow/MathMultiTurn-v0", {"max_turns": 3})
            await env.reset(options={"task": TASK})
            await env.step("4")
            state = await env.state_dict()
            fresh = await runner.make("astraflow/MathMultiTurn-v0", {"max_turns": 3})
            assert fresh.saves_state
            await fresh.load_state_dict(json.loads(json.dumps(state)))
            _, reward, terminated, _, info = await fresh.step("5")
            assert (reward, terminated, info["turn"]) == (1.0, True, 2)
            other = await runner.make("astraflow/Search-v0", {})
            assert not other.saves_state and await other.state_dict() is None
        finally:
            runner.shutdown()

    asyncio.run(main())


def test_tool_envs_resume_with_their_call_counts():
    """``Tools-v0`` and ``SearchTools-v0`` save the task, the turn and what they count (tool
    calls, searches), so a resumed episode reports the counts of the whole episode."""
    from pathlib import Path

    from astraflow.envs.search.tools_env import SearchToolsEnv
    from astraflow.envs.tools.env import ToolEnv

    from astraflow.tools.calls import ToolCall

    calc = Path(__file__).resolve().parents[1] / "tools" / "calc_tools.py"
    env = ToolEnv(tools=[f"{calc}:calculator"], max_turns=3)
    env.reset(options={"task": {"question": "What is 2*3?", "answer": "6"}})
    env.step([ToolCall(id="c1", name="calculator", arguments={"expression": "2*3"})])
    fresh = ToolEnv(tools=[f"{calc}:calculator"], max_turns=3)
    fresh.load_state_dict(_moved(env))
    assert (fresh.turn, fresh.tool_calls) == (1, 1)
    _, reward, terminated, _, info = fresh.step("6")
    assert (reward, terminated, info["tool_calls"]) == (1.0, True, 1)
    with pytest.raises(ValueError, match="tool_calls"):
        ToolEnv(max_turns=3).load_state_dict({**_moved(env), "tool_calls": -1})

    search = SearchToolsEnv(max_turns=3)
    search.reset(seed=0)
    search.step([ToolCall(id="s1", name="search", arguments={"query": "capital"})])
    again = SearchToolsEnv(max_turns=3)
    again.load_state_dict(_moved(search))
    assert (again.turn, again.tool_calls, again.searches) == (1, 1, 1)
    assert again.task == search.task
