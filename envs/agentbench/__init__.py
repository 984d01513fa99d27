"""AgentBench v0.2 environments (dbbench, os_interaction, alfworld), data loaders, reference solutions
(:mod:`.oracle`) and AgentBench's metrics (:mod:`.report`). Running evaluations is the rollout
side's job (:mod:`astraflow.rollout.evaluation.agentbench`); nothing here imports it.

Importing this package is cheap: the env classes load lazily through their entry-point strings.
"""

from __future__ import annotations

from astraflow.envs.registry import EnvSpec

DB_ENV_ID = "astraflow/AgentBench-DB-v0"
OS_ENV_ID = "astraflow/AgentBench-OS-v0"
ALFWORLD_ENV_ID = "astraflow/AgentBench-ALFWorld-v0"

SPECS = [
    EnvSpec(
        id=DB_ENV_ID,
        entry_point="astraflow.envs.agentbench.dbbench.env:AgentBenchDBEnv",
        family="agentbench",
        description="AgentBench v0.2 dbbench: SQL agent on SQLite (default) or MySQL/MariaDB",
    ),
    EnvSpec(
        id=OS_ENV_ID,
        entry_point="astraflow.envs.agentbench.os.env:AgentBenchOSEnv",
        family="agentbench",
        description="AgentBench v0.2 os_interaction: bash agent in a throw-away overlay/Docker system",
    ),
    EnvSpec(
        id=ALFWORLD_ENV_ID,
        entry_point="astraflow.envs.agentbench.alfworld.env:AgentBenchALFWorldEnv",
        family="agentbench",
        description="AgentBench v0.2 ALFWorld: household TextWorld games (needs astraflow[alfworld])",
    ),
]
