"""A third-party env plugin used by the plugin test: an env that wants its question echoed."""

from __future__ import annotations

from typing import Any, ClassVar

from astraflow.api import EnvSpec, TextEnv


class EchoEnv(TextEnv):
    family: ClassVar[str] = "acme"
    description: ClassVar[str] = "Repeat the word you are shown"
    action_format: ClassVar[str] = "The word, exactly"
    reward_doc: ClassVar[str] = "1.0 when the action equals the word, else 0.0"
    task_fields: ClassVar[dict[str, str]] = {"word": "the word to repeat (str)"}

    def sample_task(self, rng) -> dict[str, Any]:
        return {"word": ["alpha", "beta", "gamma"][int(rng.integers(0, 3))]}

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return task["word"], {}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        success = action.strip() == self.task["word"]
        return "", float(success), True, {"success": success}


def register() -> list[EnvSpec]:
    return [EnvSpec(id="acme/Echo-v0", entry_point="acme_envs:EchoEnv", family="acme",
                    description="Repeat the word you are shown")]  # fmt: skip
