"""Every registered env (built in, code, agentbench, plugins) passes Gymnasium's check_env without
warnings and survives random episodes on its sample tasks."""

from __future__ import annotations

import pytest

from cli.envs import check_one
from envs.registry import default_registry

SPECS = default_registry().specs()


def test_builtin_families_are_registered():
    ids = {s.id for s in SPECS}
    assert {"astraflow/Math-v0", "astraflow/MathMultiTurn-v0", "astraflow/Search-v0"} <= ids


#: envs whose check takes long (ALFWorld loads TextWorld games): in the full suite only
_SLOW_ENVS = {"astraflow/AgentBench-ALFWorld-v0"}


@pytest.mark.parametrize(
    "env_id",
    [pytest.param(s.id, marks=pytest.mark.slow) if s.id in _SLOW_ENVS else s.id for s in SPECS],
)
def test_check_env_and_random_episodes(env_id):
    if env_id == "astraflow/AgentBench-OS-v0":
        from envs.agentbench.os.sandbox import docker_available, overlay_problem

        if not docker_available() and overlay_problem() is not None:
            pytest.skip(f"no OS sandbox here: {overlay_problem()}")
    if env_id == "astraflow/AgentBench-ALFWorld-v0":  # its sample tasks are the dev games
        from agentbench_helpers import need_alfworld, need_alfworld_data

        need_alfworld()
        need_alfworld_data()
    row = check_one(env_id, {}, episodes=2, seed=0, max_action_chars=120)
    assert row["ok"], row.get("traceback")
    assert row["warnings"] == [], row["warnings"]
