"""``textarena:ID``: a TextArena game by its id (``textarena:GuessTheNumber-v0``).

A payload is a seeded game instance (task set ``textarena``: ``{"id", "seed"}``). The game's
observation is the prompt; TextArena's observation holds the whole game log, so each later turn
adds only what is new since that player's last one (its conversation already holds the rest). The
reward is the game's reward when it ends (TextArena's ``close()``); invalid moves are the game's to
judge, as in TextArena.

Single-player games (the default, ``num_players = 1``) run under ``single_agent``. A game for
several players (``env_kwargs = { num_players = 2 }``, e.g. ``textarena:TicTacToe-v0``) is a
multi-role episode under the ``turn_taking`` workflow: every reset and step names the player to
move as ``info["player"]`` (``player_0``, ``player_1``) and returns that player's observation; at
the end ``info["rewards"]`` holds every player's reward, and the returned reward is the mover's.
"""

from __future__ import annotations

from typing import Any

from astraflow.envs.base import TextEnv
from astraflow.envs.ecosystems import require


class TextArenaEnv(TextEnv):
    family = "textarena"
    description = "A TextArena game by its id (several players: the turn_taking workflow)"
    action_format = "The game's (its prompt says, e.g. a guess in square brackets)"
    reward_doc = "The game's reward for player 0 at the end (TextArena close())"
    task_fields = {"seed": "Seed of the game instance (int)", "id": "optional: task id"}

    def __init__(self, env_name: str, max_turns: int = 1, render_mode: str | None = None,
                 num_players: int = 1, **env_kwargs: Any):  # fmt: skip
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if num_players < 1:
            raise ValueError(f"textarena:{env_name}: num_players must be >= 1, got {num_players}")
        self._ta = require("textarena")
        self.env_name = env_name
        self.num_players = num_players
        self.env_kwargs = env_kwargs
        self.inner = None
        self._seen: dict[int, str] = {}
        self._player = 0

    def sample_task(self, rng) -> dict[str, Any]:
        seed = int(rng.integers(0, 2**31 - 1))
        return {"id": f"{self.env_name}/seed-{seed}", "seed": seed}

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.inner = self._ta.make(self.env_name, **self.env_kwargs)
        self.inner.reset(num_players=self.num_players, seed=int(task["seed"]))
        self._seen = {}
        obs = self._observation()
        return obs, self._whose_move()

    def _whose_move(self) -> dict[str, Any]:
        return {"player": f"player_{self._player}"} if self.num_players > 1 else {}

    def _observation(self) -> str:
        player, obs = self.inner.get_observation()
        self._player = int(player)
        text = obs if isinstance(obs, str) else str(obs)
        seen = self._seen.get(self._player, "")
        new = text[len(seen) :] if text.startswith(seen) else text
        self._seen[self._player] = text
        return new.strip() or text

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        mover = self._player
        done, step_info = self.inner.step(action)
        info: dict[str, Any] = {"game": dict(step_info or {})}
        if not done:
            obs = self._observation()
            return obs, 0.0, False, {**info, **self._whose_move()}
        rewards, game_info = self.inner.close()
        rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        reward = rewards.get(mover, 0.0)
        info["game"] = dict((game_info or {}).get(mover, {}))
        info["success"] = reward > 0
        if self.num_players > 1:
            info["rewards"] = {f"player_{i}": rewards.get(i, 0.0) for i in range(self.num_players)}
        self.inner = None
        return "", reward, True, info

    def close(self):
        self.inner = None
