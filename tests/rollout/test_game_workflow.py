"""``turn_taking``: a two-player TextArena game (the real package) as one multi-role episode, each
player a role with its own sequence; scripted players make the game's outcome known."""

from __future__ import annotations

import asyncio

import pytest
from astraflow.envs.registry import default_registry

from astraflow.protocol import Task
from astraflow.protocol.arrays import generated_runs
from astraflow.rollout.engines import SamplingParams
from astraflow.rollout.engines.scripted import ScriptedEngine
from astraflow.rollout.env_runner import EnvRunner
from astraflow.rollout.workflows import WorkflowError, default_workflows
from astraflow.rollout.workflows.base import RolePolicy

pytest.importorskip("textarena", reason="textarena is in the ecosystems and test extras")


def play(moves: dict[str, list[str]], roles=("player_0", "player_1"), max_turns=9):
    async def main():
        registry = default_registry()
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=2)
        scripts = {r: iter(moves[r]) for r in moves}
        policies = {
            role: RolePolicy(
                "policy",
                ScriptedEngine(lambda _obs, role=role: next(scripts[role])),
                SamplingParams(max_tokens=16),
            )
            for role in roles
        }
        task = Task(env="textarena:TicTacToe-v0", payload={"id": "g", "seed": 3},
                    workflow="turn_taking")  # fmt: skip
        spec = default_workflows().get("turn_taking")
        try:
            return await spec.fn(task, policies, runner.make, max_turns=max_turns, num_players=2)
        finally:
            runner.shutdown()

    return asyncio.run(main())


def test_two_player_game_is_one_episode_with_a_trajectory_per_player():
    # player 0 takes the middle column (4, 1, 7); player 1 answers 0, 2
    ep = play({"player_0": ["[4]", "[1]", "[7]"], "player_1": ["[0]", "[2]"]})
    assert ep.finish_reason == "terminated"
    assert ep.rewards == {"player_0": 1.0, "player_1": -1.0}
    by_role = {t.role: t for t in ep.trajectories}
    assert [len(generated_runs(by_role[r].loss_mask)) for r in ("player_0", "player_1")] == [3, 2]
    # each player's moves are its own turns; the final rewards land on each one's last move
    assert by_role["player_0"].turn_rewards == [0.0, 0.0, 1.0]
    assert by_role["player_1"].turn_rewards == [0.0, -1.0]
    # player 1 sees player 0's moves as context of its own conversation
    tok = ScriptedEngine(lambda _: "").tokenizer
    seen_by_1 = tok.decode(by_role["player_1"].tokens)
    assert "[Player 0] [4]" in seen_by_1 and "Player 1" in seen_by_1


def test_a_player_without_a_policy_is_named():
    with pytest.raises(WorkflowError, match="the move of 'player_1'.*map every player"):
        play({"player_0": ["[4]"]}, roles=("player_0",))
