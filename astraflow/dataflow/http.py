"""HTTP plumbing of the dataflow service: auth and size guard, body decoding, content negotiation.

Bodies are msgpack (``application/msgpack``) or JSON; replies use the type the client accepts
(``Accept``), else the request's type, else JSON. Bodies are decoded by
:func:`astraflow.protocol.codec.decode` rather than by FastAPI, so msgpack and JSON share one
validation path, token arrays stay packed bytes, and a 422 names the offending fields.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from astraflow.dataflow.access import allowed_roles
from astraflow.protocol.auth import TokenVerifier, bearer, roles_phrase
from astraflow.protocol.codec import JSON, MSGPACK, BodyTooLarge, encode

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


def negotiate(scope: dict) -> tuple[str, str]:
    """(request body type, reply type) of a request, from its Content-Type and Accept headers.

    One function for FastAPI's routes and the raw-ASGI fast path, so both pick the same types.
    """
    ctype = (_header(scope, b"content-type") or b"").decode("latin-1")
    accept = (_header(scope, b"accept") or b"").decode("latin-1")
    request = (
        MSGPACK if ctype.startswith(MSGPACK) or ctype.startswith("application/x-msgpack") else JSON
    )
    if MSGPACK in accept or "application/x-msgpack" in accept:
        return request, MSGPACK
    if JSON in accept:
        return request, JSON
    return request, request


def request_type(request: Request) -> str:
    return negotiate(request.scope)[0]


def reply_type(request: Request) -> str:
    return negotiate(request.scope)[1]


def reply_body(result: Any, ctype: str, raw_model: type[BaseModel] | None = None) -> bytes:
    """A reply's bytes: a protocol model, or (``raw_model`` given) a wire dict whose arrays are
    already packed (msgpack: sent as is; JSON: validated as ``raw_model``, arrays as lists)."""
    if raw_model is None:
        return encode(result, ctype)
    if ctype == MSGPACK:
        return msgpack.packb(result, use_bin_type=True)
    return raw_model.model_validate(result).model_dump_json().encode()


def error_body(detail: str, fields: list[str], ctype: str) -> bytes:
    body = {"detail": detail, "fields": fields}
    return msgpack.packb(body) if ctype == MSGPACK else json.dumps(body).encode()


def respond(request: Request, model: BaseModel, status: int = 200) -> Response:
    ctype = reply_type(request)
    return Response(reply_body(model, ctype), status_code=status, media_type=ctype)


def respond_raw(request: Request, data: Any, model: type[BaseModel], status: int = 200) -> Response:
    """Reply with a wire dict whose arrays are already packed (msgpack fast path)."""
    ctype = reply_type(request)
    return Response(reply_body(data, ctype, model), status_code=status, media_type=ctype)


def error_response(request: Request, status: int, detail: str, fields: list[str]) -> Response:
    ctype = reply_type(request)
    return Response(error_body(detail, fields, ctype), status_code=status, media_type=ctype)
