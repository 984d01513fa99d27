"""A third-party plugin: an env that asks for a number doubled, and a generated task set for it.

Nothing in AstraFlow names this package: it is found through its ``astraflow.envs`` and
``astraflow.tasks`` entry points (see ../pyproject.toml).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from astraflow.api import EnvSpec, TaskSetInfo, TextEnv


class DoubleEnv(TextEnv):
    family: ClassVar[str] = "acme"
    description: ClassVar[str] = "Double the number you are shown"
    action_format: ClassVar[str] = "The number, in digits"
    reward_doc: ClassVar[str] = "1.0 when the action is twice the number, else 0.0"
    task_fields: ClassVar[dict[str, str]] = {
        "number": "the number to double (int)",
        "id": "optional task id",
    }

    def sample_task(self, rng) -> dict[str, Any]:
        return {"number": int(rng.integers(0, 50))}

    def _reset_task(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return f"{task['number']}+{task['number']}=", {}

    def _step_text(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        success = action.strip() == str(2 * int(self.task["number"]))
        return "", float(success), True, {"success": success}


def envs() -> list[EnvSpec]:
    return [EnvSpec(id="acme/Double-v0", entry_point="acme_tasks:DoubleEnv", family="acme",
                    description="Double the number you are shown")]  # fmt: skip


def doubles(split: str, seed: int = 0, n: int = 64) -> list[dict[str, Any]]:
    """``n`` numbers to double; train and test draw from disjoint seeds."""
    rng = random.Random(f"acme:{split}:{seed}")
    return [{"id": f"acme-{split}-{i}", "number": rng.randint(0, 49)} for i in range(n)]


def task_sets() -> list[TaskSetInfo]:
    return [
        TaskSetInfo(
            "acme_doubles", doubles, ("train", "test"), "Numbers to double (acme)", "acme/Double-v0"
        )  # fmt: skip
    ]
