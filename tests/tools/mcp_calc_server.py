"""A tiny MCP server (the SDK's FastMCP, named MCPServer since mcp 2) with two tools, run over
stdio by the MCP-v0 tests: ``python mcp_calc_server.py [CALL_LOG]``."""

from __future__ import annotations

import sys

try:
    from mcp.server.mcpserver import MCPServer as FastMCP  # mcp >= 2
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP

server = FastMCP("calc")
LOG = sys.argv[1] if len(sys.argv) > 1 else None


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    if LOG:
        with open(LOG, "a") as f:
            f.write(f"multiply {a} {b}\n")
    return a * b


@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    return a / b


@server.tool()
def hint() -> str:
    """Give a hint for the question."""
    if LOG:
        with open(LOG, "a") as f:
            f.write("hint\n")
    return "sum"


if __name__ == "__main__":
    server.run()
