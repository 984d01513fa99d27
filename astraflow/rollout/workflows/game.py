"""``turn_taking``: a multi-player game, one role per player (``player_0``, ``player_1``, ...).

The env says whose move it is: ``info["player"]`` (a role name) on reset and after every step, and,
when the game ends, each player's reward as ``info["rewards"]`` (role -> reward; e.g. a two-player
TextArena game, ``textarena:TicTacToe-v0`` with ``env_kwargs = { num_players = 2 }``). Each role
sees the game as its own conversation: what the env shows it (its observation, which the env
gives only for the player to move) is context in that role's sequence, and only its own moves are
in its loss mask. A recipe maps the roles to policies: one policy for self-play
(``roles = { player_0 = "policy", player_1 = "policy" }``: two samples of it per episode) or a
trained policy against a frozen one.

Each role's sequence is bounded by ``min(max_total_tokens, engine context - 1)``; a role whose next
observation does not fit ends the episode with ``finish_reason = "length"``, scored as played (0 for
a game that did not end). ``max_turns`` bounds the moves of all players together.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from astraflow.protocol import Episode, Task
from astraflow.rollout.workflows import budget
from astraflow.rollout.workflows.base import EnvFactory, RolePolicy, WorkflowError, WorkflowSpec
from astraflow.rollout.workflows.single_agent import TurnRecorder, _jsonable, sampling_for
from astraflow.rollout.workflows.tokens import ChatRenderer

ROLES = ("player_0", "player_1")


async def turn_taking(
    task: Task,
    policies: Mapping[str, RolePolicy],
    make_env: EnvFactory,
    *,
    max_turns: int = 8,
    max_total_tokens: int = 4096,
    system_prompt: str | None = None,
    **env_kwargs: Any,
) -> Episode:
    env = await make_env(task.env, {"max_turns": max_turns, **env_kwargs})
    started = time.perf_counter()
    gen_s = env_s = 0.0
    recs: dict[str, TurnRecorder] = {}
    last_ids: dict[str, list[int]] = {}
    renderers: dict[str, ChatRenderer] = {}
    try:
        t0 = time.perf_counter()
        obs, info = await env.reset(seed=None, options={"task": task.payload})
        env_s += time.perf_counter() - t0
        finish = "turn_limit"
        final: Mapping[str, Any] | None = None
        for _move in range(max_turns):
            player = _player(info, policies)
            policy = policies[player]
            if player not in recs:
                renderers[player] = ChatRenderer(policy.tokenizer, system=system_prompt)
                recs[player] = TurnRecorder(player, renderers[player].prompt_ids(obs))
            else:
                seen = renderers[player].observation_ids(obs, last_ids[player])
                if not budget.fits(budget.context_limit(policy.engine, max_total_tokens),
                                   recs[player].tokens, seen):  # fmt: skip
                    finish = budget.LENGTH
                    break
                recs[player].add_context(seen)
            rec = recs[player]
            limit = budget.context_limit(policy.engine, max_total_tokens)
            if budget.room(limit, rec.tokens) <= 0:
                finish = budget.LENGTH
                break
            t0 = time.perf_counter()
            (gen,) = await policy.engine.generate(
                rec.tokens, budget.capped(sampling_for(task, policy), limit, rec.tokens)
            )
            gen_s += time.perf_counter() - t0
            rec.add_generated(gen.token_ids, gen.logprobs, gen.version)
            last_ids[player] = list(gen.token_ids)
            text = policy.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, info = await env.step(text)
            env_s += time.perf_counter() - t0
            if terminated or truncated:
                finish = "terminated" if terminated else "truncated"
                final = info.get("rewards")
                if not isinstance(final, Mapping):
                    final = {player: float(reward)}
                break
            rec.add_turn_reward(float(reward))
        for role, rec in recs.items():
            if final is not None and rec.turns:
                rec.add_turn_reward(float(final.get(role, 0.0)))
            elif rec.turns:
                rec.add_turn_reward(0.0)
        trajectories = [rec.trajectory() for rec in recs.values()]
        return Episode(
            task_id=task.id,
            trajectories=trajectories,
            rewards={role: sum(rec.run_rewards) for role, rec in recs.items()},
            finish_reason=finish,
            info=_jsonable({k: v for k, v in info.items() if k != "rewards"}),
            metrics={
                "generate_s": gen_s,
                "env_s": env_s,
                "wall_s": time.perf_counter() - started,
                "turns": float(sum(rec.turns for rec in recs.values())),
                "tokens": float(sum(len(rec.tokens) for rec in recs.values())),
            },
        )
    finally:
        await env.close()


def _player(info: Mapping[str, Any], policies: Mapping[str, RolePolicy]) -> str:
    player = info.get("player", ROLES[0])
    if player not in policies:
        raise WorkflowError(
            f"turn_taking: the env says it is the move of {player!r}, but the workflow's roles are "
            f"{sorted(policies)}; map every player to a policy in [workflow.roles]"
        )
    return str(player)


SPEC = WorkflowSpec(
    "turn_taking",
    turn_taking,
    ROLES,
    "A two-player game (the env names the player to move): one role per player, self-play or "
    "against another policy",
)
