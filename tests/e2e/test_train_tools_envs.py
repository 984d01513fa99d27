"""Real training steps with tools on the built-in tiny policy: the ``tool_agent`` workflow over
``astraflow/Tools-v0`` (a Python function) and over ``astraflow/MCP-v0`` (a real MCP server over
stdio). The tiny policy was never taught to call tools, so ``tool_choice`` names a parameterless
tool: its call is given whole on the first turn, the tool really runs (its log says so), its result
is appended as tokens and the policy answers; the answers' rewards train it (a reward it varies on:
after a tool turn, out of its training distribution, it almost never gets the sum right)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
from quickstart_run import TWO_SMALL_STEPS, train_quickstart  # noqa: E402

#: a reward the untrained tiny policy's answers vary on (is it a number?), so groups are not all 0
REWARD = json.dumps(f"{TOOLS / 'calc_tools.py'}:is_number")


def train_with_tools(tmp_path: Path, env: str, env_kwargs: str) -> None:
    log = tmp_path / "tool.log"
    run = train_quickstart(
        tmp_path,
        [
            f"tasks.env={json.dumps(env)}",
            f"tasks.env_kwargs={env_kwargs}",
            "workflow.name=tool_agent",
            "workflow.max_turns=3",
            'workflow.kwargs={ tool_choice = "hint" }',
            'policies.policy.tool_parser="hermes"',
            *TWO_SMALL_STEPS,
        ],
        env={"ASTRAFLOW_TEST_TOOL_LOG": str(log)},
    )
    assert run.step_versions == [1, 2]
    episodes = run.episodes()
    # env_timeout: a server start past rollout.env_timeout_s on a loaded machine (no sample)
    scored = [info for reason, info in episodes if reason not in ("error", "env_timeout")]
    errors = [info for reason, info in episodes if reason == "error"]
    assert scored and not errors, errors[:3]
    assert all(info["metrics"]["tool_calls"] >= 1.0 for info in scored)
    assert len(log.read_text().splitlines()) >= len(scored)  # the tool ran in every episode


@pytest.mark.slow
def test_tool_env_trains_with_python_function_tools(tmp_path):
    ref = json.dumps(f"{TOOLS / 'calc_tools.py'}:hint")
    train_with_tools(tmp_path, "astraflow/Tools-v0", f"{{ tools = [{ref}], reward = {REWARD} }}")


@pytest.mark.slow
def test_mcp_env_trains_with_an_mcp_servers_tools(tmp_path):
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra")
    args = json.dumps([str(TOOLS / "mcp_calc_server.py"), str(tmp_path / "tool.log")])
    server = f"{{ command = {json.dumps(sys.executable)}, args = {args} }}"
    kwargs = f'{{ server = {server}, tools = ["hint"], reward = {REWARD} }}'
    train_with_tools(tmp_path, "astraflow/MCP-v0", kwargs)
