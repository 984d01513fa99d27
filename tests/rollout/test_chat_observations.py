"""single_agent over an env whose observations are chat messages (SkyRL-gym's multi-turn GSM8K,
the real package): the row's system turn opens the conversation, the env's follow-up user turns
are rendered as chat turns, and each turn's reward is kept on its own."""

from __future__ import annotations

import asyncio

import pytest
from astraflow.envs import default_registry

from astraflow.protocol import Task
from astraflow.rollout.engines import SamplingParams, make_engine
from astraflow.rollout.env_runner import EnvRunner
from astraflow.rollout.workflows import RolePolicy, default_workflows
from astraflow.rollout.workflows.tokens import ChatRenderer, check_turn_messages

ROW = {
    "id": "row-0",
    "prompt": [
        {"role": "system", "content": "Answer after ####."},
        {"role": "user", "content": "What is 40 + 2?"},
    ],
    "env_class": "gsm8k_multi_turn",
    "reward_spec": {"method": "rule", "ground_truth": "42"},
    "extra_info": {"max_turns": 3},
}


def test_turn_messages_take_any_role_and_name_a_bad_one():
    tool = {"role": "tool", "content": "5", "tool_call_id": "c1", "name": "add", "x": 1}
    assert check_turn_messages([tool]) == [{k: v for k, v in tool.items() if k != "x"}]
    with pytest.raises(ValueError, match="step message 0 must be"):
        check_turn_messages([{"role": "robot", "content": "hi"}])


def test_chat_observations_render_as_turns_with_per_turn_rewards():
    pytest.importorskip("skyrl_gym")
    from astraflow.models import resolve_model

    engine = make_engine("transformers", resolve_model("builtin:tiny-arith"), device="cpu", seed=0)
    registry = default_registry()
    runner = EnvRunner(lambda env_id, kwargs: registry.make(env_id, **kwargs), workers=2)
    try:
        wf = default_workflows().get("single_agent")
        policy = RolePolicy("policy", engine, SamplingParams(temperature=1.0, max_tokens=8))
        task = Task(env="skyrl:gsm8k_multi_turn", payload=ROW, group_size=1)
        ep = asyncio.run(wf.fn(task, {"agent": policy}, runner.make, max_turns=3,
                               max_total_tokens=240))  # fmt: skip
    finally:
        runner.shutdown()
        asyncio.run(engine.close())
    (traj,) = ep.trajectories
    prompt = ChatRenderer(engine.tokenizer).prompt_ids("", ROW["prompt"])
    assert traj.tokens[: len(prompt)] == prompt  # the system turn is the row's own
    text = engine.tokenizer.decode(traj.tokens)
    assert "<|user|>Please provide your step-by-step reasoning" in text  # SkyRL's follow-up turn
    turn_rewards = ep.info["turn_rewards"]
    assert len(turn_rewards) == traj.num_turns == 2  # the third turn is past the token budget
    assert ep.rewards["agent"] == sum(turn_rewards)
    # kept on the trajectory too, one per run of generated tokens (trainer.turn_discount)
    assert traj.turn_rewards == turn_rewards
    assert ep.finish_reason == "length"
