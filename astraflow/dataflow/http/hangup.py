"""Long polls whose client hangs up are cancelled, so the service can take back what they held.

Why: a lease request parks at the service for up to ``wait_s``. When its client goes away (a node
killed, a connection cut, a client timing out) nothing reads the answer; without this, a lease
granted to it meanwhile stayed active until a retry with the same key or its deadline. Once the
request's body has been read, this ASGI wrapper waits for the server's ``http.disconnect`` beside
the handler and cancels the handler when it comes; the service (``DataflowService.lease``) then
returns any grant the request got.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


class HangUpWatch:
    """Cancel the handling of ``(method, path)`` requests when their client disconnects."""

    def __init__(self, app, routes: Iterable[tuple[str, str]]) -> None:
        self.app = app
        self.routes = frozenset(routes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) not in self.routes:
            return await self.app(scope, receive, send)
        body_read = asyncio.Event()

        async def watched_receive() -> dict:
            if body_read.is_set():  # nothing but a disconnect can come now: the watcher's
                return await asyncio.shield(disconnect)
            message = await receive()
            if message["type"] != "http.disconnect" and not message.get("more_body", False):
                body_read.set()
            return message

        async def watch() -> dict:
            await body_read.wait()
            message = await receive()
            if message["type"] == "http.disconnect":
                handling.cancel()
            return message

        handling = asyncio.ensure_future(self.app(scope, watched_receive, send))
        disconnect = asyncio.ensure_future(watch())
        try:
            await asyncio.shield(handling)
        except asyncio.CancelledError:
            if not handling.cancelled():  # this task itself was cancelled: pass it on
                handling.cancel()
                raise
            # the client hung up and the handler was cancelled: nobody to answer
        finally:
            disconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await disconnect
