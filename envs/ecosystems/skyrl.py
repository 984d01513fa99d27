"""``skyrl:ID``: a SkyRL-gym env (``BaseTextEnv``: ``init``/``step``) by its registered id.

A payload is a row of SkyRL's dataset layout as is (task set ``skyrl_parquet``): ``prompt`` (chat
messages), ``env_class``, ``reward_spec`` and ``extra_info``. SkyRL builds one env per episode
from the row (``skyrl_gym.make(id, env_config=..., extras=row)``); so does this adapter, at each
reset. Its chat-message observations come back as the observation text (the messages' contents)
and, whole, as ``info["messages"]`` (roles kept, ``tool`` included), which workflows render as
chat turns; each step's reward is the turn's reward; ``done`` ends the episode.
"""

from __future__ import annotations

from typing import Any

from astraflow.envs.base import TaskError, TextEnv
from astraflow.envs.ecosystems import require
from astraflow.envs.ecosystems.messages import messages_text


class SkyRLEnv(TextEnv):
    family = "skyrl"
    description = "A SkyRL-gym env by its registered id"
    action_format = "The wrapped SkyRL env's (its own prompt says)"
    reward_doc = "The SkyRL env's per-step reward (turn-level), from its reward_spec"
    task_fields = {
        "prompt": "Chat messages opening the episode (list of {role, content})",
        "reward_spec": "SkyRL reward spec (e.g. {method: rule, ground_truth: ...})",
        "extra_info": "optional: SkyRL extra_info (passed to the env as extras)",
        "env_class": "optional: the SkyRL env id the row was made for (must match the env id)",
    }

    def __init__(self, env_name: str, max_turns: int = 1, render_mode: str | None = None,
                 env_config: dict[str, Any] | None = None):  # fmt: skip
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self._skyrl = require("skyrl")
        if env_name not in self._skyrl.registry:
            known = ", ".join(sorted(self._skyrl.registry))
            raise ValueError(f"skyrl:{env_name}: no SkyRL-gym env {env_name!r} (known: {known})")
        self.env_name = env_name
        self.env_config = dict(env_config or {})
        self.inner = None

    def sample_task(self, rng) -> dict[str, Any]:
        a, b = (int(x) for x in rng.integers(1, 50, size=2))
        question = f"What is {a} + {b}? Put the answer after ####."
        return {
            "id": f"skyrl-sample-{a}-{b}",
            "prompt": [{"role": "user", "content": question}],
            "env_class": self.env_name,
            "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
            "extra_info": {},
        }

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        env_class = task.get("env_class")
        if env_class and env_class != self.env_name:
            raise TaskError(
                f"skyrl:{self.env_name}: the row's env_class is {env_class!r}; "
                f"use env = 'skyrl:{env_class}' for it"
            )
        prompt = task["prompt"]
        if not isinstance(prompt, list) or not prompt:
            raise TaskError(f"skyrl:{self.env_name}: 'prompt' must be a non-empty message list")
        self.close()
        extras = {k: v for k, v in task.items() if k not in ("id", "prompt", "env_class")}
        extras.setdefault("extra_info", {})
        self.inner = self._skyrl.make(self.env_name, env_config=self.env_config, extras=extras)
        messages, metadata = self.inner.init([dict(m) for m in prompt])
        info = {**dict(metadata or {}), "messages": [dict(m) for m in messages]}
        return messages_text(messages[-1:]), info

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        out = self.inner.step(action)
        reward = float(out.get("reward") or 0.0)
        info = dict(out.get("metadata") or {})
        observations = [dict(m) for m in out.get("observations") or []]
        info["messages"] = observations
        info["reward"] = reward
        done = bool(out.get("done"))
        if done:
            info.setdefault("success", reward >= 1.0)
        return messages_text(observations), reward, done, info

    def close(self):
        if self.inner is not None:
            self.inner.close()
            self.inner = None
