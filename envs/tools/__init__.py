"""Function-calling environments: Python functions (``Tools-v0``) or an MCP server's tools
(``MCP-v0``) as the tools of an episode. Importing this package is cheap: the ``mcp`` SDK and the
tools' modules load only when an env is made."""

from astraflow.envs.registry import EnvSpec

SPECS: list[EnvSpec] = [
    EnvSpec(
        id="astraflow/Tools-v0",
        entry_point="astraflow.envs.tools.env:ToolEnv",
        family="tools",
        description="Function calling over the recipe's Python functions (tools = [...])",
    ),
]
SPECS.append(
    EnvSpec(
        id="astraflow/MCP-v0",
        entry_point="astraflow.envs.tools.mcp_env:MCPEnv",
        family="tools",
        description="Function calling over the tools of any MCP server (stdio or streamable HTTP)",
    )
)
