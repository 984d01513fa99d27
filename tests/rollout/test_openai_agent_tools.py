"""``openai_agent`` with function calling: the gateway records an agent's tool loop token-exactly
(the resent assistant turn with its tool calls is matched to the ids that produced it), refuses a
rewritten call, and ends a conversation that outgrows the context with ``length``, kept."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the openai SDK is in the test extra")

from astraflow.protocol import Task  # noqa: E402
from astraflow.rollout.engines import SamplingParams  # noqa: E402
from astraflow.rollout.env_runner import EnvRunner  # noqa: E402
from astraflow.rollout.workflows import default_workflows  # noqa: E402
from astraflow.rollout.workflows.base import RolePolicy  # noqa: E402
from astraflow.rollout.workflows.tokens import ChatRenderer  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools"))
from reply_engine import ReplyEngine  # noqa: E402

AGENTS = HERE / "openai_agents" / "tool_agents.py"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123*456"}}\n</tool_call>'
TASK = Task(
    env="astraflow/Math-v0",
    payload={"question": "What is 123*456?", "answer": "56088"},
    workflow="openai_agent",
)


def run(engine, agent: str, **kwargs):
    from astraflow.envs import default_registry

    async def main():
        registry = default_registry()
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1)
        workflows = default_workflows()
        policy = RolePolicy("policy", engine, SamplingParams(max_tokens=100), True, "hermes")
        try:
            (ep,) = await asyncio.gather(
                workflows.get("openai_agent").fn(
                    TASK, {"agent": policy}, runner.make, agent=f"{AGENTS}:{agent}", **kwargs
                ),
                return_exceptions=True,
            )
            return ep
        finally:
            await workflows.aclose()
            runner.shutdown()

    return asyncio.run(main())


def test_a_tool_loop_is_one_token_exact_trajectory():
    engine = ReplyEngine([CALL, "56088"])
    ep = run(engine, "calculate")
    assert not isinstance(ep, BaseException), ep
    assert ep.finish_reason == "terminated" and ep.rewards == {"agent": 1.0}
    assert ep.metrics["calls"] == 2.0 and ep.metrics["tool_calls"] == 1.0
    (traj,) = ep.trajectories
    tok = engine.tokenizer
    first, second = engine.prompts
    gen1 = tok.encode(CALL) + [tok.eos_token_id]
    # the resent assistant turn is the generated ids themselves, then only the tool message
    assert second[: len(first) + len(gen1)] == first + gen1
    tools = [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression.",
                "parameters": {
                    "type": "object",
                    "properties": {"expression": {"type": "string"}},
                    "required": ["expression"],
                },
            },
        }
    ]
    tool_msg = [{"role": "tool", "tool_call_id": "x", "content": "56088"}]
    feedback = ChatRenderer(tok, tools=tools).messages_ids(tool_msg, gen1)
    assert second == first + gen1 + feedback
    assert traj.tokens == second + tok.encode("56088") + [tok.eos_token_id]
    assert [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m] == (
        gen1 + tok.encode("56088") + [tok.eos_token_id]
    )


def test_a_rewritten_tool_call_is_refused_with_400():
    import openai

    ep = run(ReplyEngine([CALL, "2"]), "rewrites_the_call")
    assert isinstance(ep, openai.BadRequestError)
    assert "does not continue the conversation" in ep.message


def test_a_conversation_that_outgrows_the_context_ends_with_length_and_is_kept():
    engine = ReplyEngine(["12345678"], max_context=120)
    ep = run(engine, "never_stops")
    assert not isinstance(ep, BaseException), ep
    assert ep.finish_reason == "length"
    (traj,) = ep.trajectories
    assert len(traj.tokens) < 120 and sum(traj.loss_mask) > 0
    assert all(len(p) < 120 for p in engine.prompts)  # no prompt the engine must refuse
    assert ep.rewards == {"agent": 0.0}
