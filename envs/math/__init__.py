"""Math environments (answers graded with math-verify). Importing this package is cheap: the env
classes, and math-verify with them, load only when an env is made."""

from astraflow.envs.registry import EnvSpec

SPECS: list[EnvSpec] = [
    EnvSpec(
        id="astraflow/Math-v0",
        entry_point="astraflow.envs.math.env:MathEnv",
        family="math",
        description="Math problem, one answer, graded with math-verify",
    ),
    EnvSpec(
        id="astraflow/MathMultiTurn-v0",
        entry_point="astraflow.envs.math.env:MathMultiTurnEnv",
        family="math",
        description="Math problem, several tries with 'incorrect, try again' feedback",
    ),
]
