"""The code environment family (cheap to import: env classes load lazily by entry point)."""

from astraflow.envs.registry import EnvSpec

SPECS = [
    EnvSpec(
        id="astraflow/Code-v0",
        entry_point="astraflow.envs.code.env:CodeEnv",
        family="code",
        description="Write a Python function; reward = fraction of the task's tests passed in a sandbox.",
    ),
    EnvSpec(
        id="astraflow/CodeMultiTurn-v0",
        entry_point="astraflow.envs.code.env:CodeMultiTurnEnv",
        family="code",
        description="Code with test feedback: failing tests are returned for another try (max_turns).",
    ),
]
