"""The dataflow service's front door: bearer-token and role check, early 413 from Content-Length.

A pure ASGI middleware in front of both the FastAPI app and the raw-ASGI fast path, so every route
(and every unknown path) is guarded alike before routing.
"""

from __future__ import annotations

import json

from astraflow.dataflow.http.access import allowed_roles
from astraflow.dataflow.http.bodies import header
from astraflow.protocol.auth import TokenVerifier, bearer, roles_phrase
from astraflow.protocol.codec import JSON
from astraflow.protocol.routes import open_paths

#: Where the guard leaves the caller's role in the ASGI scope.
ROLE_SCOPE_KEY = "astraflow.role"
#: Paths reachable without a token.
OPEN_PATHS = open_paths()


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
    the path does not allow (:mod:`astraflow.dataflow.http.access`) is 403, naming the role needed.
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
        auth = header(scope, b"authorization")
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
        scope[ROLE_SCOPE_KEY] = role  # handlers that act per caller read it (routes.Caller)
        allowed = allowed_roles(scope["path"])
        if role not in allowed:
            detail = (
                f"{scope['method']} {scope['path']} needs {roles_phrase(allowed)}; "
                f"the token sent is a {role} token"
            )
            await _send_json(send, 403, {"detail": detail, "fields": []})
            return
        length = header(scope, b"content-length")
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
