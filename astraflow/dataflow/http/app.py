"""The dataflow service's HTTP API (FastAPI), built from the route table
(:mod:`astraflow.dataflow.http.routes`) like the raw-ASGI fast path in front of it.

Every route but ``GET /healthz`` needs ``Authorization: Bearer <token>``: the run secret (admin) or
a role token derived from it, whose role the route allows (:mod:`astraflow.dataflow.http.access`).
Bodies are msgpack or JSON (see :mod:`astraflow.dataflow.http.bodies`); the OpenAPI document at
``/openapi.json`` describes both and names each route's roles (``x-roles``).
"""

from __future__ import annotations

import inspect
import os
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.errors import DataflowError
from astraflow.dataflow.http.access import allowed_roles
from astraflow.dataflow.http.bodies import (
    error_response,
    read_body,
    request_type,
    respond,
    respond_raw,
)
from astraflow.dataflow.http.fastpath import FastPath
from astraflow.dataflow.http.guard import OPEN_PATHS, GuardMiddleware
from astraflow.dataflow.http.hangup import HangUpWatch
from astraflow.dataflow.http.routes import ROUTES, Api, Caller, Route
from astraflow.dataflow.ops.service import DataflowService
from astraflow.dataflow.ops.task_feeder import TaskSource
from astraflow.protocol import DecodeError
from astraflow.protocol.auth import ROLES, TokenVerifier
from astraflow.protocol.codec import JSON, MSGPACK
from astraflow.protocol.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from astraflow.protocol.prometheus import exposition, status_families
from astraflow.protocol.routes import METRICS_PATH
from astraflow.recipe.schema import Recipe

REQUEST_MODELS = [route.body for route in ROUTES if route.body is not None]


def _body(model) -> dict:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": ref}, MSGPACK: {"schema": ref}},
        }
    }


_ERRORS = {
    401: {"description": "Missing or wrong token"},
    403: {"description": "A valid token of a role this route does not allow (see x-roles)"},
    413: {"description": "Body larger than dataflow.max_body_mb"},
    422: {"description": "Malformed body; `fields` names the offending fields"},
}


def _endpoint(route: Route, api: Api, limit: int):
    """A FastAPI endpoint for ``route``: decode the body, call the handler, encode the reply.

    Its signature (request, path parameters, query parameters) is built from the route so that
    FastAPI validates the query and documents all of them.
    """

    async def endpoint(request: Request, **params):
        args = ()
        if route.body is not None:
            args = (route.decode(await read_body(request, limit), request_type(request), limit),)
        if route.caller:
            params["caller"] = Caller.of(request.scope)
        result = await route.handler(api, *args, **params)
        if route.reply is None:
            return result
        if route.raw_reply:
            return respond_raw(request, result, route.reply)
        return respond(request, result)

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("request", kw, annotation=Request)]
    params += [inspect.Parameter(name, kw, annotation=str) for name in route.path_params]
    params += route.query
    endpoint.__signature__ = inspect.Signature(params)
    endpoint.__name__ = route.handler.__name__
    endpoint.__doc__ = route.handler.__doc__
    return endpoint


def _add_route(app: FastAPI, route: Route, api: Api, limit: int) -> None:
    guarded = route.path not in OPEN_PATHS
    errors = {code: {"description": text} for code, text in route.errors.items()}
    app.add_api_route(
        route.path,
        _endpoint(route, api, limit),
        methods=[route.method],
        tags=list(route.tags),
        summary=route.summary,
        response_model=(route.reply or dict) if route.document_reply else None,
        openapi_extra=_body(route.body) if route.body is not None else None,
        responses={**_ERRORS, **errors} if guarded else None,
    )


class DataflowApp(FastAPI):
    """FastAPI with an outer ASGI chain (set in :func:`create_app`) that runs before FastAPI's
    per-request machinery (middleware stack, telemetry hooks, routing)."""

    outer = None

    async def fastapi_call(self, scope, receive, send) -> None:
        await super().__call__(scope, receive, send)

    async def __call__(self, scope, receive, send) -> None:
        if self.outer is None or scope["type"] == "lifespan":
            await super().__call__(scope, receive, send)
        else:
            await self.outer(scope, receive, send)


def _private_store(path: Path) -> None:
    """Create the store file 0600 (or make an existing one 0600) before SQLite opens it.

    Why: SQLite creates a new database with the process umask (0644 under the usual 022), and its
    ``-wal`` and ``-shm`` files copy the database's mode; the store holds every prompt, answer and
    credential digest of the run, and policy code on the code env's ``process`` backend runs as
    another local user (issue 48, #8). An empty file is a valid new SQLite database.
    """
    path = Path(path)
    if str(path) == ":memory:":
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists():
            os.chmod(p, 0o600)


def create_app(
    recipe: Recipe,
    store_path: Path | str | None = None,
    token: str = "",
    *,
    task_source: TaskSource,
    config: ServiceConfig | None = None,
    synchronous: str = "FULL",
) -> FastAPI:
    """The dataflow service as an ASGI app; the store opens now, background work at startup.
    ``task_source`` loads the recipe's task sets (``astraflow.tasks.catalog.load_task_set``)."""
    if not token:
        raise ValueError("the dataflow service needs a run token (--token or ASTRAFLOW_TOKEN)")
    verifier = TokenVerifier.from_secret(token)  # a role token instead of the secret: ValueError
    config = config or ServiceConfig.from_recipe(recipe)
    store_path = (
        Path(store_path)
        if store_path
        else (recipe.dataflow.store or recipe.run.run_dir / "dataflow.db")
    )
    _private_store(store_path)
    service = DataflowService(config, store_path, task_source=task_source, synchronous=synchronous)
    limit = config.max_body_bytes

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = DataflowApp(
        title="AstraFlow dataflow service",
        version="1",
        description=(
            "Tasks, leases, trajectories, per-policy buffers, batches and versions of one run. "
            "Bodies: application/msgpack (token arrays as packed little-endian int32/float32 "
            "bytes) or application/json (plain lists). Auth: `Authorization: Bearer <token>` "
            "on every route but /healthz: the run secret (admin) or a node/trainer/admin token "
            "derived from it; `x-roles` names the roles each route accepts (401: no token of "
            "this run; 403: a token of another role)."
        ),
        lifespan=lifespan,
        separate_input_output_schemas=False,
    )
    app.state.service = service
    api = Api(service=service, verifier=verifier, recipe=config.recipe)
    # Outside FastAPI's own stack: the guard (auth, size) runs first on every request, then the
    # fast path answers the hot msgpack routes; everything else goes through FastAPI. Both are
    # built from the one route table (routes.py).
    app.outer = GuardMiddleware(
        HangUpWatch(
            FastPath(app.fastapi_call, ROUTES, api, max_body_bytes=limit),
            [(r.method, r.path) for r in ROUTES if r.endpoint.long_poll],
        ),
        token=verifier,
        max_body_bytes=limit,
    )

    # -- errors -----------------------------------------------------------------------------
    def _refused(request: Request, status: int, fields: list[str]) -> None:
        route = request.scope.get("route")
        path = getattr(route, "path", request.url.path)
        service.refusals.count(status, request.method, path, fields)

    @app.exception_handler(DecodeError)
    async def _decode_error(request: Request, exc: DecodeError):
        _refused(request, exc.status, exc.fields)
        return error_response(request, exc.status, str(exc), exc.fields)

    @app.exception_handler(DataflowError)
    async def _domain_error(request: Request, exc: DataflowError):
        fields = [exc.field] if exc.field else []
        _refused(request, exc.status, fields)
        return error_response(request, exc.status, str(exc), fields)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        fields = [".".join(str(p) for p in e.get("loc", ())) for e in errors]
        detail = "; ".join(f"{f}: {e.get('msg')}" for f, e in zip(fields, errors, strict=False))
        return error_response(request, 422, detail, fields)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        return error_response(request, exc.status_code, str(exc.detail), [])

    # -- routes -----------------------------------------------------------------------------
    for route in ROUTES:
        _add_route(app, route, api, limit)

    @app.get(METRICS_PATH, include_in_schema=False)
    async def _metrics() -> Response:
        """Prometheus text (admin token): the status as metric families plus the service's own
        histograms; see :mod:`astraflow.protocol.prometheus`."""
        st = await service.status()
        body = exposition(service.metrics.registry, list(status_families(st)))
        return Response(body, media_type=PROMETHEUS_CONTENT_TYPE)

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
            separate_input_output_schemas=False,
        )
        _, defs = models_json_schema(
            [(m, "validation") for m in REQUEST_MODELS],
            ref_template="#/components/schemas/{model}",
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, sub in defs.get("$defs", {}).items():
            components.setdefault(name, sub)
        schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, ops in schema.get("paths", {}).items():
            for op in ops.values():
                if path not in OPEN_PATHS:
                    op["security"] = [{"bearer": []}]
                    op["x-roles"] = [r for r in ROLES if r in allowed_roles(path)]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
    return app
