"""``gym:ID``: a registered Gymnasium env with text observations and text actions, unchanged.

The payload is a seeded reset (task set ``gym_seeds``): ``{"id", "seed"}``. Observations are
passed through as text (``str(obs)`` for a non-string observation, so a space of another kind still
reads); actions are the policy's text. The env's own reward is the reward, its ``terminated`` the
episode end and its ``truncated`` a truncation.
"""

from __future__ import annotations

from typing import Any

from astraflow.envs.base import TextEnv
from astraflow.envs.ecosystems import require


class GymTextEnv(TextEnv):
    family = "gym"
    description = "A registered Gymnasium env with text observations and actions"
    action_format = "Whatever the wrapped env's action space accepts as text"
    reward_doc = "The wrapped env's reward, per step"
    task_fields = {"seed": "Seed of the wrapped env's reset (int)", "id": "optional: task id"}

    def __init__(self, env_name: str, max_turns: int = 1, render_mode: str | None = None,
                 **env_kwargs: Any):  # fmt: skip
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        gym = require("gym")
        self.env_name = env_name
        self.inner = gym.make(env_name, **env_kwargs)
        # the wrapped env ends episodes itself; TextEnv's turn limit is the recipe's max_turns

    def sample_task(self, rng) -> dict[str, Any]:
        seed = int(rng.integers(0, 2**31 - 1))
        return {"id": f"{self.env_name}/seed-{seed}", "seed": seed}

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        obs, info = self.inner.reset(seed=int(task["seed"]))
        return _text(obs), dict(info)

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.inner.step(action)
        info = dict(info)
        if truncated and not terminated:
            info.setdefault("truncated_by_env", True)
        # the wrapped env's truncation ends the episode too: reported as terminated=False below
        self._inner_truncated = bool(truncated)
        return _text(obs), float(reward), bool(terminated), info

    def step(self, action: str):
        obs, reward, terminated, truncated, info = super().step(action)
        if getattr(self, "_inner_truncated", False) and not terminated:
            truncated = True
            info.setdefault("success", False)
        return obs, reward, terminated, truncated, info

    def close(self):
        self.inner.close()


def _text(obs: Any) -> str:
    return obs if isinstance(obs, str) else str(obs)
