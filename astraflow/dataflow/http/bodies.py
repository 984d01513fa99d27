"""Request and reply bodies of the dataflow service: body reading, content negotiation, encoding.

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

from astraflow.protocol.codec import JSON, MSGPACK, BodyTooLarge, encode


def header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value
    return None


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
    ctype = (header(scope, b"content-type") or b"").decode("latin-1")
    accept = (header(scope, b"accept") or b"").decode("latin-1")
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
