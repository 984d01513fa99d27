"""Raw-ASGI serving of the routes the table marks ``fast``: trajectory pushes, leases, heartbeats.

Why: under load, FastAPI's per-request machinery (middleware stack, routing, dependency solving,
response objects) cost as much CPU as the work itself. These routes carry nearly all of the
traffic from rollout nodes, so when a request is msgpack both ways it is decoded, executed and
answered here. The route itself (decoder, handler, reply type) comes from the same
:data:`~astraflow.dataflow.http.routes.ROUTES` entry that FastAPI serves, with the same content
negotiation and error bodies (:mod:`astraflow.dataflow.http.bodies`), so only the plumbing differs.
"""

from __future__ import annotations

from collections.abc import Iterable

from astraflow.dataflow.errors import DataflowError
from astraflow.dataflow.http.bodies import error_body, negotiate, reply_body
from astraflow.dataflow.http.routes import Api, Route
from astraflow.protocol.codec import MSGPACK, BodyTooLarge, DecodeError

_MSGPACK = MSGPACK.encode()


class FastPath:
    def __init__(self, app, routes: Iterable[Route], api: Api, max_body_bytes: int) -> None:
        self.app = app
        self.api = api
        self.limit = max_body_bytes
        self.routes = tuple(r for r in routes if r.fast)
        self.methods = frozenset(r.method for r in self.routes)

    def _match(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        for route in self.routes:
            if route.method == method:
                match = route.pattern.match(path)
                if match:
                    return route, match.groupdict()
        return None

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in self.methods
            and negotiate(scope) == (MSGPACK, MSGPACK)
        ):
            found = self._match(scope["method"], scope["path"])
            if found is not None:
                return await self._serve(*found, receive, send)
        await self.app(scope, receive, send)

    async def _serve(self, route: Route, params: dict[str, str], receive, send) -> None:
        try:
            body = route.decode(await self._read(receive), MSGPACK, self.limit)
            args = (body,) if route.body is not None else ()
            result = await route.handler(self.api, *args, **params)
            raw_model = route.reply if route.raw_reply else None
            payload, status = reply_body(result, MSGPACK, raw_model), 200
        except DecodeError as exc:
            payload, status = error_body(str(exc), exc.fields, MSGPACK), exc.status
            self.api.service.refusals.count(status, route.method, route.path, exc.fields)
        except DataflowError as exc:
            fields = [exc.field] if exc.field else []
            payload, status = error_body(str(exc), fields, MSGPACK), exc.status
            self.api.service.refusals.count(status, route.method, route.path, fields)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", _MSGPACK),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def _read(self, receive) -> bytes:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise DecodeError("client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                raise BodyTooLarge(
                    f"body exceeds the limit of {self.limit} bytes (dataflow.max_body_mb)"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
