"""Raw-ASGI serving of the hottest msgpack routes: trajectory pushes, leases and heartbeats.

Why: under load, FastAPI's per-request machinery (middleware stack, routing, dependency solving,
response objects) cost as much CPU as the work itself. These three routes carry nearly all of the
traffic from rollout nodes, so when a request is msgpack both ways it is decoded, executed and
answered here, with exactly the same validation (:mod:`astraflow.protocol.codec`,
:mod:`astraflow.dataflow.packed`), semantics (:class:`DataflowService`) and error bodies as the
FastAPI routes, which still serve JSON and document the API in OpenAPI.
"""

from __future__ import annotations

import re

import msgpack

from astraflow.dataflow.errors import DataflowError
from astraflow.dataflow.packed import decode_push
from astraflow.dataflow.service import DataflowService
from astraflow.protocol import Heartbeat, LeaseRequest
from astraflow.protocol.codec import MSGPACK, BodyTooLarge, DecodeError, decode, encode

_HEARTBEAT = re.compile(r"^/nodes/([^/]+)/heartbeat$")
_MSGPACK = MSGPACK.encode()
_JSON = b"application/json"


def _wants_msgpack(scope) -> bool:
    ctype = accept = b""
    for key, value in scope["headers"]:
        if key == b"content-type":
            ctype = value
        elif key == b"accept":
            accept = value
    if not ctype.startswith(_MSGPACK):
        return False
    return _MSGPACK in accept or _JSON not in accept


class FastPath:
    def __init__(self, app, service: DataflowService, max_body_bytes: int) -> None:
        self.app = app
        self.service = service
        self.limit = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and _wants_msgpack(scope):
            path = scope["path"]
            if path == "/trajectories":
                return await self._serve(receive, send, self._push)
            if path == "/leases":
                return await self._serve(receive, send, self._lease)
            match = _HEARTBEAT.match(path)
            if match:
                return await self._serve(receive, send, self._heartbeat, match.group(1))
        await self.app(scope, receive, send)

    async def _push(self, body: bytes):
        req, packed = decode_push(body, self.limit)
        return await self.service.push(req, packed)

    async def _lease(self, body: bytes):
        return await self.service.lease(decode(LeaseRequest, body, MSGPACK, self.limit))

    async def _heartbeat(self, body: bytes, node_id: str):
        return await self.service.heartbeat(node_id, decode(Heartbeat, body, MSGPACK, self.limit))

    async def _serve(self, receive, send, handler, *args) -> None:
        try:
            body = await self._read(receive)
            payload, status = encode(await handler(body, *args), MSGPACK), 200
        except DecodeError as exc:
            payload, status = msgpack.packb({"detail": str(exc), "fields": exc.fields}), exc.status
        except DataflowError as exc:
            fields = [exc.field] if exc.field else []
            payload, status = msgpack.packb({"detail": str(exc), "fields": fields}), exc.status
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
