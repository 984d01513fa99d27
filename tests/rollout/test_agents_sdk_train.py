"""The OpenAI Agents SDK trains under ``workflow.name = "openai_agent"``: an ``Agent`` with a
``@function_tool`` (tests/rollout/openai_agents/sdk_agent.py, unmodified apart from the client it
is given) runs through the real SDK and the node's real gateway; its tool really runs in every
episode and the trained samples carry the call and the tool's result."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="openai-agents is in the test extra")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from quickstart_run import TWO_SMALL_STEPS, train_quickstart  # noqa: E402

from astraflow.dataflow.storage import history  # noqa: E402

AGENT = Path(__file__).resolve().parent / "openai_agents" / "sdk_agent.py"


@pytest.mark.slow
def test_an_agents_sdk_agent_with_a_function_tool_trains(tmp_path):
    tool_log = tmp_path / "tool_calls.log"
    run = train_quickstart(
        tmp_path,
        [
            "workflow.name=openai_agent",
            f"workflow.agent={json.dumps(f'{AGENT}:solve')}",
            *TWO_SMALL_STEPS,
        ],
        env={"ASTRAFLOW_TEST_TOOL_LOG": str(tool_log)},
    )
    assert run.step_versions == [1, 2]
    episodes = run.episodes()
    # every episode: the forced call, the tool's result, one more model turn for the answer
    assert episodes and all(
        i["metrics"]["tool_calls"] == 1.0 and i["metrics"]["calls"] == 2.0 for _, i in episodes
    )
    assert {reason for reason, _ in episodes} <= {"terminated", "length"}
    assert len(tool_log.read_text().splitlines()) == len(episodes)  # the tool ran each time
    samples = [r for r in run.read(history.samples) if r.policy == "policy"]
    assert samples and sum(r.n_tokens for r in samples) > 0
