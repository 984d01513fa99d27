"""The rollout node's own OpenAI-compatible endpoint for agent code (``openai_agent`` workflow).

One endpoint per node, on loopback, served on the node's event loop so it shares the node's engines
(the generations of agent calls are batched with every other episode's). Each episode gets a fresh
random API key; the key names the episode, so the endpoint knows whose call it is (which roles it
may use, which sampling applies, where to record), and a key stops working when its episode ends.
The model names an episode may call are its workflow roles.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from astraflow.protocol.http_server import HTTPServer
from astraflow.rollout.engines.openai_server import Route, create_app
from astraflow.rollout.workflows.base import RolePolicy
from astraflow.rollout.workflows.call_recorder import EpisodeCalls


@dataclass
class AgentSession:
    """What one episode's key opens: its roles' engines and sampling, and its recorder."""

    policies: Mapping[str, RolePolicy]
    calls: EpisodeCalls
    #: sampling values that win over the agent's (an evaluation's greedy decoding)
    overrides: dict[str, Any] = field(default_factory=dict)


class _SessionRouter:
    def __init__(self, sessions: dict[str, AgentSession]):
        self._sessions = sessions

    def authorize(self, token: str) -> AgentSession | None:
        return self._sessions.get(token) if token else None

    def models(self, caller: AgentSession) -> list[str]:
        return list(caller.policies)

    def route(self, caller: AgentSession, model: str) -> Route:
        policy = caller.policies[model]
        return Route(
            policy.engine,
            replace(policy.sampling, n=1),
            dict(caller.overrides),
            caller.calls,
            policy.tool_parser,
        )


class AgentGateway:
    """Starts on first use in the running loop; ``base_url`` is ``http://127.0.0.1:PORT/v1``."""

    def __init__(self, host: str = "127.0.0.1", pool_size: int = 16):
        self.host = host
        self.pool_size = pool_size
        self._sessions: dict[str, AgentSession] = {}
        self._server: HTTPServer | None = None
        self._http: Any = None
        self._starting: asyncio.Lock | None = None
        self._starting_loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        if self._server is not None and self._server.loop is loop:
            return self.base_url
        if self._starting is None or self._starting_loop is not loop:
            self._starting, self._starting_loop = asyncio.Lock(), loop
        async with self._starting:
            if self._server is None or self._server.loop is not loop:
                # first use, or a new loop (the old server died with its loop)
                app = create_app(router=_SessionRouter(self._sessions), title="AstraFlow node")
                server = HTTPServer(app, self.host, lifespan="off", name="agent-gateway")
                self._server = await server.start()
                self._http = None
        return self.base_url

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return self._server.url + "/v1"

    def http_client(self):
        """One pooled HTTP client for every episode's SDK client (no proxies: loopback)."""
        if self._http is None:
            import httpx
            import openai

            # A bounded pool: httpcore checks every pooled connection on each request, and on
            # loopback a few connections carry all the traffic (the SDK's default allows 1000).
            limits = httpx.Limits(
                max_connections=self.pool_size, max_keepalive_connections=self.pool_size
            )
            self._http = openai.DefaultAsyncHttpxClient(trust_env=False, limits=limits)
        return self._http

    def open(self, session: AgentSession) -> str:
        key = "ep-" + secrets.token_urlsafe(24)
        self._sessions[key] = session
        return key

    def close_session(self, key: str) -> None:
        self._sessions.pop(key, None)

    async def aclose(self) -> None:
        self._sessions.clear()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._server is not None:
            try:
                current = asyncio.get_running_loop()
            except RuntimeError:
                current = None
            if self._server.loop is current:  # else it ended with its own loop
                await self._server.stop()
            self._server = None
