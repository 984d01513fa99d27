"""An OpenAI Agents SDK agent, written as its docs show: an ``Agent`` with a ``@function_tool``,
run by ``Runner``. The only AstraFlow-specific thing is the client it is given (the gateway's
``AsyncOpenAI``, through ``OpenAIChatCompletionsModel``). ``tool_choice`` names the tool so the tiny
policy, which was never taught to call tools, makes the call deterministically; nothing here imports
AstraFlow."""

from __future__ import annotations

import os

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)  # no tracing export from a rollout node (nothing to reach)


@function_tool
def get_hint() -> str:
    """Return a hint for the question."""
    log = os.environ.get("ASTRAFLOW_TEST_TOOL_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
    return "add"


async def solve(client: AsyncOpenAI, task: dict) -> str:
    agent = Agent(
        name="solver",
        tools=[get_hint],
        model=OpenAIChatCompletionsModel(model="agent", openai_client=client),
        model_settings=ModelSettings(tool_choice="get_hint"),
    )
    result = await Runner.run(agent, task["question"], max_turns=3)
    return str(result.final_output or "")
