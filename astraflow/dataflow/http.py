"""HTTP plumbing of the dataflow service: auth and size guard, body decoding, content negotiation.

Bodies are msgpack (``application/msgpack``) or JSON; replies use the type the client accepts
(``Accept``), else the request's type, else JSON. Bodies are decoded by
:func:`astraflow.protocol.codec.decode` rather than by FastAPI, so msgpack and JSON share one
validation path, token arrays stay packed bytes, and a 422 names the offending fields.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgpack
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from astraflow.dataflow.access import allowed_roles
from astraflow.protocol.auth import TokenVerifier, bearer, roles_phrase
from astraflow.protocol.codec import JSON, MSGPACK, BodyTooLarge, decode, encode

M = TypeVar("M", bound=BaseModel)

#: Paths reachable without a token.
OPEN_PATHS = frozenset({"/healthz"})


def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value
    return None


async def _send_json(send, status: int, body: dict, extra_headers=()) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", JSON.encode()), (b"content-length", str(len(data)).encode())]
    headers.extend(extra_headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class GuardMiddleware:
    """Bearer-token and role check on every path but /healthz, and an early 413 from
    Content-Length.

    A pure ASGI middleware (no body buffering): it runs before routing, so even unknown paths and
    the OpenAPI document need a token. A missing or unknown token is 401; a valid token whose role
    the path does not allow (:mod:`astraflow.dataflow.access`) is 403, naming the role needed.
    """

    def __init__(self, app, token: str | TokenVerifier, max_body_bytes: int) -> None:
        self.app = app
        self.verifier = (
            token if isinstance(token, TokenVerifier) else TokenVerifier.from_secret(token)
        )
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        auth = _header(scope, b"authorization")
        token = bearer(auth)
        role = self.verifier.role_of(token) if token is not None else None
        if role is None:
            detail = (
                "missing run token: send 'Authorization: Bearer <token>'"
                if token is None
                else "wrong run token: neither the run secret nor a role token of this run"
            )
            await _send_json(send, 401, {"detail": detail}, [(b"www-authenticate", b"Bearer")])
            return
        allowed = allowed_roles(scope["path"])
        if role not in allowed:
            detail = (
                f"{scope['method']} {scope['path']} needs {roles_phrase(allowed)}; "
                f"the token sent is a {role} token"
            )
            await _send_json(send, 403, {"detail": detail, "fields": []})
            return
        length = _header(scope, b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                await _send_json(send, 400, {"detail": "invalid Content-Length header"})
                return
            if n > self.max_body_bytes:
                await _send_json(
                    send,
                    413,
                    {
                        "detail": f"body of {n} bytes exceeds the limit of "
                        f"{self.max_body_bytes} bytes (dataflow.max_body_mb)"
                    },
                )
                return
        await self.app(scope, receive, send)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) more than ``limit`` bytes even without Content-Length."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body exceeds the limit of {limit} bytes (dataflow.max_body_mb)")
        chunks.append(chunk)
    return b"".join(chunks)


def request_type(request: Request) -> str:
    ctype = request.headers.get("content-type", "")
    return (
        MSGPACK if ctype.startswith(MSGPACK) or ctype.startswith("application/x-msgpack") else JSON
    )


async def parse(request: Request, cls: type[M], limit: int) -> M:
    body = await read_body(request, limit)
    if not body:
        body = b"{}" if request_type(request) == JSON else msgpack.packb({})
    return decode(cls, body, request_type(request), max_bytes=limit)


def reply_type(request: Request) -> str:
    accept = request.headers.get("accept", "")
    if MSGPACK in accept or "application/x-msgpack" in accept:
        return MSGPACK
    if JSON in accept:
        return JSON
    return request_type(request)


def respond(request: Request, model: BaseModel, status: int = 200) -> Response:
    ctype = reply_type(request)
    return Response(encode(model, ctype), status_code=status, media_type=ctype)


def respond_raw(request: Request, data: Any, model: type[BaseModel], status: int = 200) -> Response:
    """Reply with a wire dict whose arrays are already packed (msgpack fast path)."""
    ctype = reply_type(request)
    if ctype == MSGPACK:
        return Response(
            msgpack.packb(data, use_bin_type=True), status_code=status, media_type=MSGPACK
        )
    return Response(
        model.model_validate(data).model_dump_json(), status_code=status, media_type=JSON
    )


def error_response(request: Request, status: int, detail: str, fields: list[str]) -> Response:
    body = {"detail": detail, "fields": fields}
    ctype = reply_type(request)
    if ctype == MSGPACK:
        return Response(msgpack.packb(body), status_code=status, media_type=MSGPACK)
    return Response(json.dumps(body), status_code=status, media_type=JSON)
