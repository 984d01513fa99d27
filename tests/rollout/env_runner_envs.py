"""Envs for the env-runner tests: a sync env whose step sleeps, one whose step hangs until it is
closed, and one that speaks the async protocol (``areset``/``astep``/``aclose``).

They are real Gymnasium envs registered in an :class:`astraflow.envs.registry.EnvRegistry` under ``test/*``
ids (see :func:`registry`), built by the node through the same registry path as built-in envs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import gymnasium as gym
from astraflow.envs.base import text_space
from astraflow.envs.registry import EnvRegistry, EnvSpec

SLEEPY = "test/Sleepy-v0"
HANG_ONCE = "test/HangOnce-v0"
ASYNC = "test/Async-v0"


class _TextEnv(gym.Env):
    def __init__(self, max_turns: int = 1, **_: Any):
        self.max_turns = max_turns
        self.turn = 0
        self.observation_space = text_space()
        self.action_space = text_space()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.turn = 0
        task = (options or {}).get("task") or {}
        return str(task.get("question", "q")), {}

    def _outcome(self):
        self.turn += 1
        done = self.turn >= self.max_turns
        return "again", 1.0, False, done, {"success": done}


class SleepyEnv(_TextEnv):
    """Each step blocks its thread for ``step_s`` (a stand-in for a sandbox run or a query)."""

    def __init__(self, step_s: float = 1.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.step_s = step_s

    def step(self, action: str):
        time.sleep(self.step_s)
        return self._outcome()


class HangOnceEnv(_TextEnv):
    """The first step taken in this process hangs until the env is closed (a resource that only
    a kill frees); every other step returns at once. Records what happened for the test."""

    hung = threading.Event()  # set when the hanging step starts
    released = threading.Event()  # set when close() freed it
    returned = threading.Event()  # set when the hung step's thread got out
    _claimed = threading.Lock()
    _taken = False

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._closed = threading.Event()

    def step(self, action: str):
        with HangOnceEnv._claimed:
            first = not HangOnceEnv._taken
            HangOnceEnv._taken = True
        if first:
            HangOnceEnv.hung.set()
            self._closed.wait(300)
            HangOnceEnv.returned.set()
        return self._outcome()

    def close(self):
        if HangOnceEnv.hung.is_set() and not self._closed.is_set():
            HangOnceEnv.released.set()
        self._closed.set()


class AsyncEnv(_TextEnv):
    """An env with I/O-bound tools: ``astep`` awaits instead of blocking. The sync methods raise,
    so any use of them (in a thread) fails the test."""

    threads: list[threading.Thread] = []
    closed = 0

    async def areset(self, *, seed: int | None = None, options: dict | None = None):
        AsyncEnv.threads.append(threading.current_thread())
        await asyncio.sleep(0.01)
        return super().reset(seed=seed, options=options)

    async def astep(self, action: str):
        AsyncEnv.threads.append(threading.current_thread())
        await asyncio.sleep(0.2)
        return self._outcome()

    async def aclose(self) -> None:
        AsyncEnv.closed += 1

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        raise AssertionError("sync reset called on an env that has areset")

    def step(self, action: str):
        raise AssertionError("sync step called on an env that has astep")

    def close(self):
        raise AssertionError("sync close called on an env that has aclose")


def registry() -> EnvRegistry:
    reg = EnvRegistry()
    reg._loaded = True  # only the test envs: no entry-point discovery needed
    for env_id, cls in ((SLEEPY, "SleepyEnv"), (HANG_ONCE, "HangOnceEnv"), (ASYNC, "AsyncEnv")):
        reg.add(EnvSpec(env_id, f"{__name__}:{cls}", family="test"))
    return reg


def factory(**defaults: Any):
    """The node's plain env factory over the test registry (kwargs as ``service.make_env``)."""
    reg = registry()
    return lambda env_id, kwargs: reg.make(env_id, **{**defaults, **kwargs})
