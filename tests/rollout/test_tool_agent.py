"""The ``tool_agent`` workflow: model turn -> parser -> env runs the calls -> tool messages
appended as tokens to the same sequence (never re-rendered), through a real env runner."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from astraflow.protocol import Task
from astraflow.rollout.engines.base import SamplingParams
from astraflow.rollout.env_runner import EnvRunner
from astraflow.rollout.workflows import default_workflows
from astraflow.rollout.workflows.base import RolePolicy
from astraflow.rollout.workflows.tokens import ChatRenderer

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "calc_tools.py"
sys.path.insert(0, str(TOOLS.parent))
from reply_engine import ReplyEngine  # noqa: E402

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123*456"}}\n</tool_call>'


def run(engine, task_payload, **kwargs):
    from envs import default_registry

    async def main():
        registry = default_registry()
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1, timeout_s=120)
        spec = default_workflows().get("tool_agent")
        policies = {
            "agent": RolePolicy("policy", engine, SamplingParams(max_tokens=200), True, "hermes")
        }
        task = Task(env="astraflow/Tools-v0", payload=task_payload, workflow="tool_agent")
        try:
            return await spec.fn(
                task, policies, runner.make, tools=[f"{TOOLS}:calculator"], **kwargs
            )
        finally:
            runner.shutdown()

    return asyncio.run(main())


TASK = {"question": "What is 123*456?", "answer": "56088"}


def test_the_call_runs_and_its_result_is_appended_as_tokens():
    engine = ReplyEngine([CALL, "56088"])
    ep = run(engine, TASK)
    assert ep.finish_reason == "terminated" and ep.rewards == {"agent": 1.0}
    assert ep.metrics["tool_calls"] == 1.0 and ep.metrics["invalid_tool_calls"] == 0.0
    (traj,) = ep.trajectories
    tok = engine.tokenizer
    text = tok.decode(traj.tokens)
    # the schema is in the prompt, the tool's real result after the call
    assert "calculator(expression: string)" in text.split(CALL)[0]
    assert "<|im_start|>tool\n56088<|im_end|>" in text
    # token-exact: the second prompt is the first prompt + the generated ids + the tool message
    first, second = engine.prompts
    gen1 = tok.encode(CALL) + [tok.eos_token_id]
    assert second[: len(first) + len(gen1)] == first + gen1
    renderer = ChatRenderer(tok, tools=None)
    feedback = second[len(first) + len(gen1) :]
    tool_msg = [{"role": "tool", "tool_call_id": "x", "name": "calculator", "content": "56088"}]
    assert feedback == renderer.messages_ids(tool_msg, gen1)
    masked = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
    assert masked == gen1 + tok.encode("56088") + [tok.eos_token_id]
    assert set(traj.versions[len(first) : len(first) + len(gen1)]) == {3}


def test_a_malformed_call_ends_the_episode_as_invalid_tool_call():
    ep = run(
        ReplyEngine(['<tool_call>\n{"name": "calculator", "arguments": {"expression": ']), TASK
    )
    assert ep.finish_reason == "invalid_tool_call" and ep.rewards == {"agent": 0.0}
    assert ep.metrics["invalid_tool_calls"] == 1.0 and "not closed" in ep.info["invalid_tool_call"]
    assert sum(ep.trajectories[0].loss_mask) > 0  # kept: the bad call is trained on


def test_an_episode_that_outgrows_the_context_ends_with_length():
    engine = ReplyEngine([CALL, CALL, CALL], max_context=0)
    first = run(ReplyEngine([CALL, "56088"]), TASK)
    prompt_len = len(first.trajectories[0].tokens)
    # room for the prompt and one call, not for its result and an answer
    engine.max_context = prompt_len - 8
    ep = run(engine, TASK)
    assert ep.finish_reason == "length"
    assert len(ep.trajectories[0].tokens) < engine.max_context
    assert all(len(p) < engine.max_context for p in engine.prompts)


def test_a_forced_tool_choice_prefills_the_first_call_only():
    from astraflow.rollout.workflows.tool_agent import tool_agent  # noqa: F401

    engine = ReplyEngine(['{"expression": "2*3"}}\n</tool_call>', "6"])
    ep = run(engine, {"question": "2*3?", "answer": "6"}, tool_choice="calculator")
    assert ep.finish_reason == "terminated" and ep.rewards == {"agent": 1.0}
    tok = engine.tokenizer
    opening = '<tool_call>\n{"name": "calculator", "arguments": '
    assert tok.decode(engine.prompts[0]).endswith(opening)
    (traj,) = ep.trajectories
    start = len(engine.prompts[0]) - len(tok.encode(opening))
    assert traj.loss_mask[start : len(engine.prompts[0])] == [0] * len(tok.encode(opening))
    assert not tok.decode(engine.prompts[1]).endswith(opening)
