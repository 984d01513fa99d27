"""Read timeouts and a per-client cap for every HTTP server of the project (issue 48, #7).

Why: uvicorn times out only idle keep-alive connections. A connection that sends half a header,
or a body one byte a minute, holds its descriptor and its request for ever: 1,000 such connections
from one client stayed open after 60 s, and under a 1,024-descriptor limit every new connection
failed. So each connection of :class:`GuardedHttpTools` (uvicorn's httptools protocol with three
additions) must

- send its request's headers within :data:`HEADER_TIMEOUT_S` of opening (or of the request's first
  byte on a kept-alive connection), else 408 and closed;
- keep its body coming: no :data:`BODY_IDLE_TIMEOUT_S` without a byte while the server is
  reading it (a body the app has not consumed yet, with reading paused, does not count), else
  408 (when no response has started) and closed;
- stay within :data:`MAX_PENDING_PER_CLIENT` connections from its address that are still
  sending a request (opened, or mid-request): one more is answered 429 and closed. Connections
  that wait for a response, or idle between requests, are not counted, so a client that keeps
  thousands of pooled connections (the scale benchmark's 4,096 nodes on one host) is unaffected,
  while a slow-sending flood holds at most this many descriptors, each for at most the timeouts.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: Seconds a client has to send a request's headers.
HEADER_TIMEOUT_S = 10.0
#: Seconds a request body may go without a byte while the server reads it.
BODY_IDLE_TIMEOUT_S = 30.0
#: Connections from one address that may be sending a request at once.
MAX_PENDING_PER_CLIENT = 256

_PENDING_ATTR = "astraflow_pending_by_client"


def _reply(transport: asyncio.Transport, status: str, message: str) -> None:
    body = message.encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    if not transport.is_closing():
        transport.write(head + body)
        transport.close()


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with header/body read timeouts and a per-client cap on
    connections still sending a request. Limits are class attributes (:func:`guarded`)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S
    max_pending_per_client: int = MAX_PENDING_PER_CLIENT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._pending = False
        self._host: str | None = None

    # -- bookkeeping -----------------------------------------------------------------------
    def _table(self) -> dict[str, int]:
        table = getattr(self.server_state, _PENDING_ATTR, None)
        if table is None:
            table = {}
            setattr(self.server_state, _PENDING_ATTR, table)
        return table

    def _set_pending(self, pending: bool) -> None:
        if pending == self._pending or self._host is None:
            return
        table = self._table()
        n = table.get(self._host, 0) + (1 if pending else -1)
        if n > 0:
            table[self._host] = n
        else:
            table.pop(self._host, None)
        self._pending = pending

    def _arm(self, seconds: float, phase: str) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(seconds, self._timed_out, phase)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _timed_out(self, phase: str) -> None:
        self._read_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if phase == "body" and self.flow is not None and self.flow.read_paused:
            self._arm(self.body_idle_timeout_s, phase)  # the app has not read what came yet
            return
        if phase == "body" and self.cycle is not None and self.cycle.response_started:
            self.transport.close()
            return
        limit = self.header_timeout_s if phase == "headers" else self.body_idle_timeout_s
        what = (
            f"request headers not received within {limit:g}s"
            if phase == "headers"
            else f"request body stalled: no data for {limit:g}s"
        )
        _reply(self.transport, "408 Request Timeout", what)

    # -- protocol --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._host = str(self.client[0]) if self.client else None
        if self._host is not None and self._table().get(self._host, 0) >= (
            self.max_pending_per_client
        ):
            _reply(
                transport,
                "429 Too Many Requests",
                f"more than {self.max_pending_per_client} connections from {self._host} are "
                "still sending their requests; finish those first",
            )
            self._host = None  # not counted: it never was pending
            return
        self._set_pending(True)
        self._arm(self.header_timeout_s, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._set_pending(True)
        if self._read_timer is None:
            self._arm(self.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm(self.body_idle_timeout_s, "body")

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._arm(self.body_idle_timeout_s, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        self._set_pending(False)
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._set_pending(False)
        super().connection_lost(exc)


def guarded(
    header_timeout_s: float = HEADER_TIMEOUT_S,
    body_idle_timeout_s: float = BODY_IDLE_TIMEOUT_S,
    max_pending_per_client: int = MAX_PENDING_PER_CLIENT,
) -> type[GuardedHttpTools]:
    """A :class:`GuardedHttpTools` with these limits (uvicorn builds one protocol per
    connection from the class it is given)."""
    if (header_timeout_s, body_idle_timeout_s, max_pending_per_client) == (
        HEADER_TIMEOUT_S,
        BODY_IDLE_TIMEOUT_S,
        MAX_PENDING_PER_CLIENT,
    ):
        return GuardedHttpTools
    return type(
        "GuardedHttpTools",
        (GuardedHttpTools,),
        {
            "header_timeout_s": header_timeout_s,
            "body_idle_timeout_s": body_idle_timeout_s,
            "max_pending_per_client": max_pending_per_client,
        },
    )
