"""Base class of AstraFlow environments: Gymnasium envs with text observations and text actions.

Why a base class: every env shares the same contract with workflows (task payload in ``reset``
options, text in and out, ``info["success"]`` at the end, a documented action format and reward), and
the registry and ``astraflow envs show`` read that documentation from the class attributes.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from astraflow.errors import AstraFlowError

#: Generous bound on one observation or action (characters).
MAX_TEXT = 65_536
#: Characters the Text spaces accept: whitespace and every printable character of the Unicode Basic
#: Multilingual Plane (no C0/C1 controls, no surrogates). Real observations (GSM8K's typographic
#: quotes, docstrings, program output) use far more than ASCII; anything outside this set (astral
#: characters such as emoji, control bytes) is replaced by :func:`fit_text`.
CHARSET = "\n\t\r" + "".join(
    chr(c) for c in [*range(0x20, 0x7F), *range(0xA0, 0xD800), *range(0xE000, 0xFFFE)]
)
_CHARSET_SET = frozenset(CHARSET)
#: Stand-in for a character outside :data:`CHARSET`.
REPLACEMENT = "\ufffd"


class TaskError(AstraFlowError, ValueError):
    """A task payload that the env cannot use; names the field and what was expected."""


@functools.lru_cache(maxsize=8)
def _text_space_prototype(max_length: int) -> spaces.Text:
    return spaces.Text(max_length=max_length, min_length=0, charset=CHARSET)


def text_space(max_length: int = MAX_TEXT) -> spaces.Text:
    """A Text space over :data:`CHARSET`.

    Building one indexes ~63k characters (tens of ms), and workflows create an env per episode, so
    each call returns a shallow copy of a cached prototype: the character tables are immutable and
    shared, the random generator is the copy's own.
    """
    space = copy.copy(_text_space_prototype(max_length))
    space._np_random = None  # each space seeds its own generator on first use
    return space


def fit_text(text: str, max_length: int = MAX_TEXT) -> str:
    """``text`` made a member of :func:`text_space`: foreign characters replaced, tail cut.

    Why: an observation must lie in the observation space (``check_env`` and workflows rely on it),
    but envs pass through text they do not control (datasets, tool output).
    """
    if len(text) > max_length:
        marker = "\n[... truncated]"
        text = text[: max_length - len(marker)] + marker
    if all(c in _CHARSET_SET for c in text):
        return text
    return "".join(c if c in _CHARSET_SET else REPLACEMENT for c in text)


class StateMixin:
    """The optional part of the env contract that lets an episode outlive its node:
    ``state_dict()`` returns the env's state between turns as plain JSON (dicts, lists, strings,
    numbers), ``load_state_dict(state)`` puts a freshly made env (same id, same kwargs, no
    ``reset``) back into it, so the next ``step`` answers as the original env would have.

    For a :class:`TextEnv` whose whole episode state is its task payload, its turn count and
    what :meth:`_reset_task` derives from the payload (the math and code envs: grading data, a
    test plan). Such an env re-derives that data by running ``_reset_task`` on the saved payload,
    so a subclass with more state must extend :meth:`state_dict` and :meth:`load_state_dict`,
    and one whose ``_reset_task`` acts on the world (starts a container, opens a session) must not
    use this mixin: an env without the two methods is replayed from the start when its node dies
    (docs/elastic.md).
    """

    #: bumped when the saved state's shape changes; a state of another version is refused
    STATE_VERSION: ClassVar[int] = 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.STATE_VERSION,
            "env": type(self).__name__,
            "task": copy.deepcopy(self.task),
            "turn": int(self.turn),
            "last_obs": self._last_obs,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"{type(self).__name__}: state must be a dict, got {type(state)}")
        if state.get("version") != self.STATE_VERSION or state.get("env") != type(self).__name__:
            raise ValueError(
                f"{type(self).__name__}: cannot load a state of {state.get('env')!r} "
                f"version {state.get('version')!r} (this env saves version {self.STATE_VERSION})"
            )
        task = state.get("task")
        if not isinstance(task, dict):
            raise TaskError(f"{type(self).__name__}: saved state has no task payload")
        turn = state.get("turn")
        if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn <= self.max_turns:
            raise ValueError(
                f"{type(self).__name__}: saved turn {turn!r} is not in [0, {self.max_turns}]"
            )
        self.validate_task(task)
        self.task = task
        self._reset_task(task)
        self.turn = turn
        self._last_obs = str(state.get("last_obs", ""))

    def _saved_count(self, state: dict[str, Any], key: str) -> int:
        """A count a subclass saved beside the base state (0 when absent); raises when it is not
        a count."""
        value = state.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{type(self).__name__}: saved {key} {value!r} is not a count")
        return value


def _missing(env: object, signature: str, what: str) -> str:
    """The message for a TextEnv method a subclass left out: which, what it returns, where to read."""
    return (
        f"{type(env).__name__} does not implement {signature}: {what}. A TextEnv implements "
        "sample_task, _reset_task and _step_text (docs/plugins.md)"
    )


class TextEnv(gym.Env):
    """A multi-turn text environment.

    Subclasses document themselves through the class attributes below and implement
    :meth:`_reset_task` and :meth:`_step_text`. ``reset(seed, options={"task": payload})`` starts an
    episode on ``payload`` (a dict whose fields are listed in ``task_fields``); without a task,
    ``reset`` draws a built-in sample task from the seed so ``check_env`` and random rollouts work.
    """

    #: ``render_fps`` means nothing for text, but Gymnasium's checker warns when it is missing.
    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}
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
        raise NotImplementedError(
            _missing(
                self,
                "sample_task(self, rng) -> dict",
                "a valid task payload drawn from the numpy Generator `rng` (`astraflow envs check` and reset() without a task use it)",
            )
        )

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:  # pragma: no cover
        """Start an episode on a validated task; return the first observation and info."""
        raise NotImplementedError(
            _missing(
                self,
                "_reset_task(self, task) -> (observation, info)",
                "the first observation of an episode on `task`",
            )
        )

    def _step_text(
        self, action: str
    ) -> tuple[str, float, bool, dict[str, Any]]:  # pragma: no cover
        """Apply one action; return (observation, reward, terminated, info)."""
        raise NotImplementedError(
            _missing(
                self,
                "_step_text(self, action) -> (observation, reward, terminated, info)",
                "one turn of the episode",
            )
        )

    # --- the Gymnasium API ----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        task = (options or {}).get("task")
        if task is None:
            task = self.sample_task(self.np_random)
        if not isinstance(task, dict):
            raise TaskError(
                f"{type(self).__name__}: options['task'] must be a dict, got {type(task).__name__}"
            )
        self.validate_task(task)
        self.task = task
        self.turn = 0
        obs, info = self._reset_task(task)
        obs = fit_text(obs, self.observation_space.max_length)
        self._last_obs = obs
        return obs, info

    def step(self, action: str):
        if not isinstance(action, str):
            raise TypeError(
                f"{type(self).__name__}: action must be str, got {type(action).__name__}"
            )
        self.turn += 1
        obs, reward, terminated, info = self._step_text(action)
        truncated = not terminated and self.turn >= self.max_turns
        if terminated or truncated:
            info.setdefault("success", False)
        obs = fit_text(obs, self.observation_space.max_length)
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
