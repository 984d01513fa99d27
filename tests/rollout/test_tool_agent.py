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
    from astraflow.envs import default_registry

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


def test_a_saved_tool_episode_resumes_on_another_engine_from_its_saved_turn():
    """``tool_agent`` saves after each tool turn (``Tools-v0`` saves its state); a second engine
    resumes from the save: the first engine's call, tool result, log-probs and versions are kept
    token for token, only the answer is generated there, and the env goes on from its turn (the
    call counted once, the answer scored)."""
    from astraflow.protocol import MSGPACK, PartialEpisode, decode, encode
    from astraflow.rollout.workflows.base import EpisodeSaver

    saved: list[PartialEpisode] = []

    async def send(partial: PartialEpisode) -> bool:
        saved.append(decode(PartialEpisode, encode(partial), MSGPACK))  # as the service keeps it
        return True

    first = ReplyEngine([CALL, CALL, "wrong"])
    played = run(first, TASK, saver=EpisodeSaver(0, after_s=0.0, send=send))
    assert played.metrics["tool_calls"] == 2.0 and [p.turns for p in saved] == [1, 2]
    at_one = saved[0]
    assert at_one.env_state["tool_calls"] == 1

    second = ReplyEngine(["56088"])
    second.version = 9
    ep = run(second, TASK, saver=EpisodeSaver(0, resume=at_one))
    assert ep.finish_reason == "terminated" and ep.rewards == {"agent": 1.0}
    assert ep.metrics["resumed_turns"] == 1.0 and ep.metrics["tool_calls"] == 1.0
    assert ep.info["tool_calls"] == 1  # the env went on from its saved count
    (before,) = at_one.trajectories
    (traj,) = ep.trajectories
    n = len(before.tokens)
    assert traj.tokens[:n] == before.tokens and traj.versions[:n] == before.versions
    assert traj.logprobs[:n] == before.logprobs and traj.loss_mask[:n] == before.loss_mask
    assert second.prompts == [before.tokens]  # one generation, on the saved sequence
    assert {v for v, m in zip(traj.versions[n:], traj.loss_mask[n:], strict=True) if m} == {9}


def test_an_mcp_env_does_not_save_its_state():
    """What an MCP server's tools did lives on the server: ``MCP-v0`` opts out of saving, so the
    node plays its episodes again rather than resuming them against a world it cannot restore."""
    from astraflow.envs.tools.mcp_env import MCPEnv

    from astraflow.rollout.env_runner import _state_holder

    env = MCPEnv(server={"command": sys.executable, "args": ["-c", "pass"]})
    assert _state_holder(env) is None
