"""``astraflow/MCP-v0``: the tools of any MCP server as an RL environment, with no code.

Recipe (stdio: the env starts the server as a subprocess; or streamable HTTP: a URL)::

    [tasks]
    env = "astraflow/MCP-v0"
    env_kwargs = { server = { command = "python", args = ["my_server.py"] } }
    # env_kwargs = { server = "http://127.0.0.1:8000/mcp", tools = ["search"] }

The server's tools (``list_tools``: name, description, input schema) are what the model is
offered; a call is ``call_tool`` and its text content is the tool message (an ``isError`` result
reads ``error: ...``). The final answer is scored as in :class:`~astraflow.envs.tools.env.ToolEnv`
(``reward`` or ``score_env``). Each env (one episode) holds one session with its server, opened on
``reset`` and closed on ``close``; everything is async (the ``mcp`` SDK is), so the node awaits it
on its loop, each call bounded by ``rollout.env_timeout_s``. The sync ``reset``/``step``/``close``
(``astraflow envs check``, notebooks) run the same coroutines on a private loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from astraflow.envs.tools.env import ToolEnv

from astraflow.errors import AstraFlowError
from astraflow.tools.calls import ToolCall


class MCPError(AstraFlowError, RuntimeError):
    """The MCP server could not be started, reached or initialised."""


def _transport(server: Any):
    """The ``mcp`` SDK's client transport for ``server`` (a URL, or stdio parameters)."""
    try:
        import mcp
        from mcp.client import stdio
    except ImportError:
        raise MCPError("MCP-v0 needs the mcp package: pip install 'astraflow[tools]'") from None
    if isinstance(server, str):
        if not server.startswith(("http://", "https://")):
            raise MCPError(f"an MCP server URL must be http(s)://..., got {server!r}")
        from mcp.client import streamable_http

        connect = (
            getattr(streamable_http, "streamable_http_client", None)
            or streamable_http.streamablehttp_client
        )
        return connect(server)
    if not isinstance(server, dict) or not isinstance(server.get("command"), str):
        raise MCPError(
            "server must be a streamable HTTP URL or {command = '...', args = [...], env = {...}, "
            f"cwd = '...'}}}} for stdio, got {server!r:.120}"
        )
    unknown = set(server) - {"command", "args", "env", "cwd"}
    if unknown:
        raise MCPError(
            f"unknown stdio server keys {sorted(unknown)}; expected command, args, env, cwd"
        )
    params = mcp.StdioServerParameters(
        command=server["command"],
        args=[str(a) for a in server.get("args", [])],
        env=server.get("env"),
        cwd=server.get("cwd"),
    )
    return stdio.stdio_client(params)


def _check_server(server: Any) -> None:
    """Raise :class:`MCPError` now (at env construction) for a server spec that cannot work."""
    _transport(server)  # built, not entered: nothing starts until reset


class MCPSession:
    """One client session with one server, owned by a task of its own.

    Why a task: the SDK's transports are anyio context managers whose cancel scopes must be left in
    the task that entered them, while the node calls ``reset``/``step``/``close`` from whatever task
    runs the episode (and ``asyncio.wait_for`` wraps them in new ones)."""

    def __init__(self, server: Any):
        self.server = server
        self.session: Any = None
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None

    async def start(self) -> MCPSession:
        self._task = asyncio.create_task(self._run(), name="mcp-session")
        await self._ready.wait()
        if self._error is not None:
            raise MCPError(f"MCP server {self.server!r:.120}: {self._error}") from self._error
        return self

    async def _run(self) -> None:
        from mcp import ClientSession

        try:
            async with _transport(self.server) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self.session = session
                    self._ready.set()
                    await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged at close
            self._error = exc
            self._ready.set()
            if isinstance(exc, asyncio.CancelledError):
                raise

    async def list_tools(self) -> list[Any]:
        tools, cursor = [], None
        while True:
            page = await (self.session.list_tools(cursor) if cursor else self.session.list_tools())
            tools += list(page.tools)
            cursor = getattr(page, "nextCursor", None) or getattr(page, "next_cursor", None)
            if not cursor:
                return tools

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        result = await self.session.call_tool(name, arguments)
        parts = []
        for block in getattr(result, "content", None) or []:
            text = getattr(block, "text", None)
            parts.append(text if text is not None else f"[{getattr(block, 'type', 'content')}]")
        is_error = bool(getattr(result, "isError", False) or getattr(result, "is_error", False))
        return "\n".join(parts), is_error

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 10)
            self._task = None


def _schema(tool: Any) -> dict[str, Any]:
    params = getattr(tool, "inputSchema", None) or getattr(tool, "input_schema", None) or {}
    fn = {"name": tool.name, "parameters": dict(params) or {"type": "object", "properties": {}}}
    if getattr(tool, "description", None):
        fn["description"] = tool.description
    return {"type": "function", "function": fn}


class MCPEnv(ToolEnv):
    """Function calling over an MCP server's tools (stdio or streamable HTTP).

    Does not save its state (``state_dict`` is None): what the server's tools did lives on the
    server, out of the env's reach, so an episode whose node dies is played again from the start
    (docs/elastic.md)."""

    #: the optional state contract is switched off (see the class docstring)
    state_dict = None  # type: ignore[assignment]
    load_state_dict = None  # type: ignore[assignment]

    description: ClassVar[str] = (
        "Function calling over the tools of any MCP server (stdio command or streamable HTTP URL)"
    )

    def __init__(
        self,
        server: dict[str, Any] | str | None = None,
        tools: Sequence[str] | None = None,
        **kwargs: Any,
    ):
        if server is None:
            raise MCPError(
                "MCP-v0 needs env_kwargs.server: {command = 'python', args = ['server.py']} or "
                "'http://host:port/mcp'"
            )
        _check_server(server)
        super().__init__(tools=(), **kwargs)
        self.server = server
        self.only = list(tools) if tools else None
        self._session: MCPSession | None = None
        self._schemas: list[dict[str, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return list(self._schemas)

    # ------------------------------------------------------------------ sync bridge
    def _sync(self, coro):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="mcp-env", daemon=True
            )
            self._thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def reset(self, *, seed=None, options=None):
        return self._sync(self.areset(seed=seed, options=options))

    def step(self, action: Any):
        return self._sync(self.astep(action))

    def close(self) -> None:
        if self._loop is None:
            return
        self._sync(self.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._loop = self._thread = None

    async def areset(self, *, seed: int | None = None, options: dict | None = None):
        if self._session is None:
            self._session = await MCPSession(self.server).start()
            listed = await self._session.list_tools()
            names = [t.name for t in listed]
            missing = sorted(set(self.only or ()) - set(names))
            if missing:
                raise MCPError(f"MCP server has no tools {missing}; it has {', '.join(names)}")
            self._schemas = [_schema(t) for t in listed if self.only is None or t.name in self.only]
        return ToolEnv.reset(self, seed=seed, options=options)

    async def acall_tool(self, call: ToolCall) -> dict[str, Any]:
        names = [s["function"]["name"] for s in self._schemas]
        if call.name not in names:
            return self._message(
                call, f"error: no tool named {call.name!r}; tools: {', '.join(names)}"
            )
        try:
            text, is_error = await self._session.call(call.name, call.arguments)
        except Exception as exc:  # noqa: BLE001 - the model sees what its call did
            return self._message(call, f"error: {type(exc).__name__}: {exc}")
        return self._message(call, f"error: {text}" if is_error else text)

    async def astep(self, action: Any):
        return await self._astep(action)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
