"""``astraflow/MCP-v0``: a real MCP server (tests/tools/mcp_calc_server.py, the SDK's FastMCP)
started over stdio; its tools are listed, called and closed through the node's env runner."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp SDK is in the test extra")

from astraflow.envs import default_registry  # noqa: E402
from astraflow.envs.tools.mcp_env import MCPError  # noqa: E402

from astraflow.rollout.env_runner import EnvRunner  # noqa: E402
from astraflow.tools.calls import ToolCall  # noqa: E402

SERVER = Path(__file__).resolve().parents[1] / "tools" / "mcp_calc_server.py"
TASK = {"question": "What is 3*4?", "answer": "12"}


def stdio(log: Path | None = None) -> dict:
    return {"command": sys.executable, "args": [str(SERVER), *([str(log)] if log else [])]}


def run(kwargs: dict, body):
    async def main():
        registry = default_registry()
        runner = EnvRunner(lambda env_id, kw: registry.make(env_id, **kw), workers=1, timeout_s=120)
        env = await runner.make("astraflow/MCP-v0", kwargs)
        try:
            return await body(env), runner.sync_calls
        finally:
            await env.close()
            runner.shutdown()

    return asyncio.run(main())


def test_an_mcp_servers_tools_are_offered_called_and_scored(tmp_path):
    log = tmp_path / "calls.log"

    async def body(env):
        obs, info = await env.reset(options={"task": TASK})
        calls = [
            ToolCall("multiply", {"a": 3, "b": 4}),
            ToolCall("divide", {"a": 1, "b": 0}),
            ToolCall("shell", {}),
        ]
        after_calls = await env.step(calls)
        return obs, info, after_calls, await env.step("12")

    (obs, info, (tool_obs, _, term, _, tinfo), final), sync_calls = run(
        {"server": stdio(log)}, body
    )
    assert obs == TASK["question"]
    names = [t["function"]["name"] for t in info["tools"]]
    assert names == ["multiply", "divide", "hint"]
    multiply = info["tools"][0]["function"]
    assert multiply["description"] == "Multiply two integers."
    assert multiply["parameters"]["properties"]["a"]["type"] == "integer"
    contents = [m["content"] for m in tinfo["tool_messages"]]
    assert contents[0] == "12" and contents[1].startswith("error:")
    assert "no tool named 'shell'" in contents[2] and not term
    assert log.read_text() == "multiply 3 4\n"  # the server really ran the call
    assert final[1] == 1.0 and final[2] is True
    assert sync_calls == 1  # only the env's construction used the pool: MCP-v0 is async


def test_a_tool_subset_and_bad_servers_are_named():
    async def body(env):
        return (await env.reset(options={"task": TASK}))[1]["tools"]

    tools, _ = run({"server": stdio(), "tools": ["divide"]}, body)
    assert [t["function"]["name"] for t in tools] == ["divide"]
    with pytest.raises(MCPError, match="has no tools"):
        run({"server": stdio(), "tools": ["sqrt"]}, body)
    with pytest.raises(MCPError, match="command"):
        default_registry().make("astraflow/MCP-v0", server={"cmd": "x"})
    with pytest.raises(MCPError, match="needs env_kwargs.server"):
        default_registry().make("astraflow/MCP-v0")
    with pytest.raises(MCPError, match="MCP server"):
        run({"server": {"command": sys.executable, "args": ["-c", "pass"]}}, body)
