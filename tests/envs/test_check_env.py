"""Every registered env (built in, code, agentbench, plugins) passes Gymnasium's check_env without
warnings and survives random episodes on its sample tasks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from astraflow.cli.envs import check_one
from astraflow.envs.registry import default_registry

SPECS = default_registry().specs()


def test_builtin_families_are_registered():
    ids = {s.id for s in SPECS}
    assert {"astraflow/Math-v0", "astraflow/MathMultiTurn-v0", "astraflow/Search-v0"} <= ids


#: envs whose check takes long (ALFWorld loads TextWorld games, MCP-v0 starts its server): in the
#: full suite only
#: env id -> its tier: ALFWorld needs the alfworld extra (nightly-only setup), MCP-v0 a server
_SLOW_ENVS = {
    "astraflow/AgentBench-ALFWorld-v0": pytest.mark.nightly,
    "astraflow/MCP-v0": pytest.mark.slow,
}
#: envs that need kwargs to exist at all
_KWARGS = {
    "astraflow/MCP-v0": {
        "server": {
            "command": sys.executable,
            "args": [str(Path(__file__).resolve().parents[1] / "tools" / "mcp_calc_server.py")],
        }
    }
}


@pytest.mark.parametrize(
    "env_id",
    [pytest.param(s.id, marks=_SLOW_ENVS[s.id]) if s.id in _SLOW_ENVS else s.id for s in SPECS],
)
def test_check_env_and_random_episodes(env_id):
    if env_id == "astraflow/AgentBench-OS-v0":
        from astraflow.envs.agentbench.os.sandbox import docker_available, overlay_problem

        if not docker_available() and overlay_problem() is not None:
            pytest.skip(f"no OS sandbox here: {overlay_problem()}")
    if env_id == "astraflow/AgentBench-ALFWorld-v0":  # its sample tasks are the dev games
        from agentbench_helpers import need_alfworld, need_alfworld_data

        need_alfworld()
        need_alfworld_data()
    row = check_one(env_id, _KWARGS.get(env_id, {}), episodes=2, seed=0, max_action_chars=120)
    assert row["ok"], row.get("traceback")
    assert row["warnings"] == [], row["warnings"]


class _Contract:
    """A valid TextEnv whose one step breaks one rule of the widened contract."""

    @staticmethod
    def make(breach: str):
        from astraflow.envs.base import TextEnv

        class Broken(TextEnv):
            def __init__(self, max_turns: int = 5, render_mode=None):
                super().__init__(max_turns=max_turns, render_mode=render_mode)

            def sample_task(self, rng):
                return {"q": "hi"}

            def _reset_task(self, task):
                return "hi", {}

            def _step_text(self, action):
                info = {"success": True}
                if breach == "reward":
                    info["reward"] = 2.0
                if breach == "messages":
                    info["messages"] = [{"role": "robot", "content": "beep"}]
                if breach == "success":
                    info["success"] = "yes"
                if breach == "both" and self.turn < 2:  # Gymnasium's checker takes one step
                    return "go on", 0.0, False, {}
                return "", 1.0, True, info

            def step(self, action):
                obs, reward, terminated, truncated, info = super().step(action)
                return obs, reward, terminated, (breach == "both" and terminated) or truncated, info

        return Broken


@pytest.mark.parametrize(
    ("breach", "message"),
    [
        ("reward", "info['reward'] 2.0 is not the returned reward 1.0"),
        ("messages", "info['messages']: step message 0 must be"),
        ("success", "info['success'] must be a bool"),
        ("both", "terminated and truncated both set"),
    ],
)
def test_envs_check_names_each_breach_of_the_contract(breach, message):
    import gymnasium as gym

    env_id = f"cktest/Broken-{breach}-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=_Contract.make(breach), disable_env_checker=True)
    row = check_one(env_id, {}, episodes=1, seed=0, max_action_chars=8)
    assert not row["ok"] and message in row["error"], row


def test_an_env_missing_sample_task_is_named_with_what_to_implement():
    """`envs check` on a plugin env without ``sample_task`` printed a bare ``NotImplementedError:``;
    the error names the class, the method, what it returns and where the contract is written."""
    from astraflow.api import TextEnv

    class NoSamples(TextEnv):
        task_fields = {"n": "a number"}

        def _reset_task(self, task):
            return "go", {}

        def _step_text(self, action):
            return "", 0.0, True, {}

    with pytest.raises(NotImplementedError) as err:
        NoSamples().reset(seed=0)
    message = str(err.value)
    assert "NoSamples does not implement sample_task(self, rng) -> dict" in message
    assert "docs/plugins.md" in message
