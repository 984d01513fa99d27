"""Base class of AstraFlow environments: Gymnasium envs with text observations and text actions.

Why a base class: every env shares the same contract with workflows (task payload in ``reset``
options, text in and out, ``info["success"]`` at the end, a documented action format and reward), and
the registry and ``astraflow envs show`` read that documentation from the class attributes.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

#: Generous bound on one observation or action (characters).
MAX_TEXT = 65_536
#: Characters the Text spaces accept: printable ASCII, whitespace and common Unicode letters/symbols.
CHARSET = "".join(chr(c) for c in range(32, 127)) + "\n\t\r" + "".join(chr(c) for c in range(0xA0, 0x250))


class TaskError(ValueError):
    """A task payload that the env cannot use; names the field and what was expected."""


def text_space(max_length: int = MAX_TEXT) -> spaces.Text:
    return spaces.Text(max_length=max_length, min_length=0, charset=CHARSET)


class TextEnv(gym.Env):
    """A multi-turn text environment.

    Subclasses document themselves through the class attributes below and implement
    :meth:`_reset_task` and :meth:`_step_text`. ``reset(seed, options={"task": payload})`` starts an
    episode on ``payload`` (a dict whose fields are listed in ``task_fields``); without a task,
    ``reset`` draws a built-in sample task from the seed so ``check_env`` and random rollouts work.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    #: Short family name shown by ``astraflow envs list`` (math, code, search, agentbench, ...).
    family: ClassVar[str] = "misc"
    description: ClassVar[str] = ""
    #: How the agent must phrase its actions (tool-call tags, fenced blocks ...).
    action_format: ClassVar[str] = ""
    #: How reward is computed.
    reward_doc: ClassVar[str] = ""
    #: Task payload fields: name -> description (required unless marked optional in the text).
    task_fields: ClassVar[dict[str, str]] = {}

    def __init__(self, max_turns: int = 1, render_mode: str | None = None):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = text_space()
        self.action_space = text_space()
        self.turn = 0
        self.task: dict[str, Any] = {}
        self._last_obs = ""

    # --- to implement -------------------------------------------------------------------------
    def sample_task(self, rng) -> dict[str, Any]:  # pragma: no cover - abstract
        """A valid task payload drawn from ``rng`` (numpy Generator), for checks and demos."""
        raise NotImplementedError

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:  # pragma: no cover
        """Start an episode on a validated task; return the first observation and info."""
        raise NotImplementedError

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:  # pragma: no cover
        """Apply one action; return (observation, reward, terminated, info)."""
        raise NotImplementedError

    # --- the Gymnasium API ----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            task = self.sample_task(self.np_random)
        if not isinstance(task, dict):
            raise TaskError(f"{type(self).__name__}: options['task'] must be a dict, got {type(task).__name__}")
        self.validate_task(task)
        self.task = task
        self.turn = 0
        obs, info = self._reset_task(task)
        self._last_obs = obs
        return obs, info

    def step(self, action: str):
        if not isinstance(action, str):
            raise TypeError(f"{type(self).__name__}: action must be str, got {type(action).__name__}")
        self.turn += 1
        obs, reward, terminated, info = self._step_text(action)
        truncated = not terminated and self.turn >= self.max_turns
        if terminated or truncated:
            info.setdefault("success", False)
        self._last_obs = obs
        return obs, float(reward), bool(terminated), bool(truncated), info

    def render(self):
        return self._last_obs

    def validate_task(self, task: dict[str, Any]) -> None:
        """Raise :class:`TaskError` naming missing required fields (those not marked optional)."""
        required = [k for k, doc in self.task_fields.items() if "optional" not in doc.lower()]
        missing = [k for k in required if k not in task]
        if missing:
            raise TaskError(
                f"{type(self).__name__}: task payload is missing {', '.join(repr(m) for m in missing)}; "
                f"expected fields: {', '.join(f'{k} ({v})' for k, v in self.task_fields.items())}"
            )
