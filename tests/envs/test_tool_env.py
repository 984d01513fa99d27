"""``astraflow/Tools-v0``: recipe-named Python functions as tools, run through the node's env
runner (sync tools in its pool, async tools on the loop, each bounded by env_timeout_s)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from astraflow.envs import default_registry

from astraflow.rollout.env_runner import EnvCallTimeout, EnvRunner
from astraflow.tools.calls import ParsedTurn, ToolCall
from astraflow.tools.schema import ToolDefinitionError

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "calc_tools.py"
CALC, LOOKUP, EXACT = f"{TOOLS}:calculator", f"{TOOLS}:lookup", f"{TOOLS}:exact"
TASK = {"question": "What is 123*456?", "answer": "56088"}


def make(**kwargs):
    return default_registry().make("astraflow/Tools-v0", **kwargs)


def test_listed_in_the_env_registry():
    spec = default_registry().get("astraflow/Tools-v0")
    assert spec.family == "tools"


def test_schemas_come_from_signatures_and_docstrings():
    env = make(tools=[CALC, LOOKUP])
    obs, info = env.reset(options={"task": TASK})
    assert obs == TASK["question"]
    calc = info["tools"][0]["function"]
    assert (
        calc["name"] == "calculator" and calc["description"] == "Evaluate an arithmetic expression."
    )
    assert calc["parameters"]["required"] == ["expression"]
    assert info["tools"][1]["function"]["parameters"]["properties"]["delay_s"]["type"] == "number"


def test_undocumented_function_is_refused_with_what_is_missing():
    with pytest.raises(ToolDefinitionError, match="docstring"):
        make(tools=["json:dumps"])
    with pytest.raises(ToolDefinitionError, match="package.module:function"):
        make(tools=["calculator"])


def test_calls_run_and_come_back_as_tool_messages_then_the_answer_is_scored():
    env = make(tools=[CALC], reward=EXACT, max_turns=3)
    env.reset(options={"task": TASK})
    good, bad, unknown = (
        ToolCall("calculator", {"expression": "123*456"}),
        ToolCall("calculator", {"expression": "import os"}),
        ToolCall("shell", {"cmd": "ls"}),
    )
    obs, reward, term, trunc, info = env.step([good, bad, unknown])
    assert (reward, term, trunc) == (0.0, False, False)
    msgs = info["tool_messages"]
    assert [m["tool_call_id"] for m in msgs] == [good.id, bad.id, unknown.id]
    assert msgs[0] == {
        "role": "tool",
        "tool_call_id": good.id,
        "name": "calculator",
        "content": "56088",
    }
    assert msgs[1]["content"].startswith("error: ValueError: not arithmetic")
    assert "no tool named 'shell'" in msgs[2]["content"]
    wrong_args = env.step(ParsedTurn("", (ToolCall("calculator", {"expr": "1"}),)))[4]
    assert "missing a required argument: 'expression'" in wrong_args["tool_messages"][0]["content"]
    obs, reward, term, trunc, info = env.step("56088")
    assert (reward, term, info["success"], info["tool_calls"]) == (1.0, True, True, 4)


def test_default_score_is_the_math_env_on_the_final_answer():
    env = make(tools=[CALC])
    env.reset(options={"task": TASK})
    assert env.step({"role": "assistant", "content": "56088"})[1] == 1.0


def test_turn_limit_ends_an_episode_that_only_calls_tools():
    env = make(tools=[CALC], max_turns=1)
    env.reset(options={"task": TASK})
    _, reward, term, trunc, info = env.step([ToolCall("calculator", {"expression": "1+1"})])
    assert (reward, term, trunc, info["success"]) == (0.0, False, True, False)


def test_only_sync_tools_run_in_the_env_pool_async_tools_on_the_loop():
    sync_env, async_env = make(tools=[CALC]), make(tools=[CALC, LOOKUP])
    assert not hasattr(sync_env, "astep") and hasattr(async_env, "astep")

    async def main():
        registry = default_registry()
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1, timeout_s=2)
        try:
            env = await runner.make("astraflow/Tools-v0", {"tools": [CALC, LOOKUP]})
            await env.reset(options={"task": TASK})
            calls = [
                ToolCall("lookup", {"key": "pi"}),
                ToolCall("calculator", {"expression": "2*3"}),
            ]
            _, _, _, _, info = await env.step(calls)
            before = runner.sync_calls
            slow = ToolCall("lookup", {"key": "pi", "delay_s": 30})
            with pytest.raises(EnvCallTimeout):
                await env.step([slow])
            return info, before, runner.sync_calls
        finally:
            runner.shutdown()

    info, before, after = asyncio.run(main())
    assert [m["content"] for m in info["tool_messages"]] == ['{"key": "pi", "value": 3.14}', "6"]
    assert after == before  # the async step never took a pool thread


def test_search_env_has_a_function_calling_variant():
    env = default_registry().make("astraflow/SearchTools-v0")
    obs, info = env.reset(seed=0)
    assert "Question:" in obs
    assert [t["function"]["name"] for t in info["tools"]] == ["search", "open"]
    assert info["tools"][1]["function"]["parameters"]["required"] == ["doc_id"]
    gold = env.search_env._golds[0]
    _, _, _, _, found = env.step([ToolCall("search", {"query": env.task["question"]})])
    text = found["tool_messages"][0]["content"]
    assert text.startswith("[")
    doc_id = text[1 : text.index("]")]
    _, _, _, _, opened = env.step([ToolCall("open", {"doc_id": doc_id})])
    assert opened["tool_messages"][0]["content"] != f"error: no passage with id {doc_id!r}"
    _, reward, term, _, done = env.step(gold)
    assert (reward, term, done["searches"], done["success"]) == (1.0, True, 1, True)
