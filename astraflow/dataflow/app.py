"""The dataflow service's HTTP API (FastAPI). Routes are thin: parse, call the service, reply.

Every route but ``GET /healthz`` needs ``Authorization: Bearer <token>``: the run secret (admin) or
a role token derived from it, whose role the route allows (:mod:`astraflow.dataflow.access`). Bodies
are msgpack or JSON (see :mod:`astraflow.dataflow.http`); the OpenAPI document at ``/openapi.json``
describes both and names each route's roles (``x-roles``).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException

from astraflow.dataflow.access import allowed_roles
from astraflow.dataflow.config import ServiceConfig
from astraflow.dataflow.errors import DataflowError
from astraflow.dataflow.fastpath import FastPath
from astraflow.dataflow.http import (
    GuardMiddleware,
    error_response,
    parse,
    read_body,
    request_type,
    respond,
    respond_raw,
)
from astraflow.dataflow.packed import decode_push
from astraflow.dataflow.service import DataflowService
from astraflow.protocol import (
    Ack,
    BatchAck,
    BatchReply,
    BatchRequest,
    DecodeError,
    EvaluationList,
    EvaluationRequest,
    EvaluationResult,
    Heartbeat,
    HeartbeatReply,
    LeaseGrant,
    LeaseRelease,
    LeaseRequest,
    NodeRegistered,
    NodeRegistration,
    PushResult,
    TrajectoryPush,
    VersionAnnouncement,
)
from astraflow.protocol.auth import ROLES, TokenDigests, TokenVerifier
from astraflow.protocol.codec import JSON, MSGPACK
from astraflow.protocol.status import DataflowStatus
from astraflow.recipe.schema import Recipe

REQUEST_MODELS = [
    NodeRegistration,
    Heartbeat,
    LeaseRequest,
    LeaseRelease,
    TrajectoryPush,
    BatchRequest,
    BatchAck,
    VersionAnnouncement,
    EvaluationRequest,
]


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


def create_app(
    recipe: Recipe,
    store_path: Path | str | None = None,
    token: str = "",
    *,
    config: ServiceConfig | None = None,
    synchronous: str = "FULL",
    task_loader=None,
) -> FastAPI:
    """The dataflow service as an ASGI app; the store opens now, background work at startup."""
    if not token:
        raise ValueError("the dataflow service needs a run token (--token or ASTRAFLOW_TOKEN)")
    verifier = TokenVerifier.from_secret(token)  # a role token instead of the secret: ValueError
    config = config or ServiceConfig.from_recipe(recipe)
    store_path = (
        Path(store_path)
        if store_path
        else (recipe.dataflow.store or recipe.run.run_dir / "dataflow.db")
    )
    service = DataflowService(config, store_path, synchronous=synchronous, task_loader=task_loader)
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
    # Outside FastAPI's own stack: the guard (auth, size) runs first on every request, then the
    # fast path answers the hot msgpack routes; everything else goes through FastAPI.
    app.outer = GuardMiddleware(
        FastPath(app.fastapi_call, service=service, max_body_bytes=limit),
        token=verifier,
        max_body_bytes=limit,
    )

    # -- errors -----------------------------------------------------------------------------
    @app.exception_handler(DecodeError)
    async def _decode_error(request: Request, exc: DecodeError):
        return error_response(request, exc.status, str(exc), exc.fields)

    @app.exception_handler(DataflowError)
    async def _domain_error(request: Request, exc: DataflowError):
        return error_response(request, exc.status, str(exc), [exc.field] if exc.field else [])

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
    @app.get("/healthz", tags=["meta"], summary="Liveness (no token needed)")
    async def healthz() -> dict:
        return {"ok": True}

    @app.post(
        "/nodes/register",
        tags=["nodes"],
        response_model=NodeRegistered,
        openapi_extra=_body(NodeRegistration),
        responses=_ERRORS,
    )
    async def register(request: Request):
        reg = await parse(request, NodeRegistration, limit)
        return respond(request, await service.register(reg))

    @app.post(
        "/nodes/{node_id}/heartbeat",
        tags=["nodes"],
        response_model=HeartbeatReply,
        openapi_extra=_body(Heartbeat),
        responses={**_ERRORS, 404: {"description": "Unknown node"}},
    )
    async def heartbeat(node_id: str, request: Request):
        hb = await parse(request, Heartbeat, limit)
        return respond(request, await service.heartbeat(node_id, hb))

    @app.delete(
        "/nodes/{node_id}",
        tags=["nodes"],
        response_model=Ack,
        responses={**_ERRORS, 404: {"description": "Unknown node"}},
    )
    async def deregister(node_id: str, request: Request):
        return respond(request, await service.deregister(node_id))

    @app.post(
        "/leases",
        tags=["leases"],
        response_model=LeaseGrant,
        openapi_extra=_body(LeaseRequest),
        responses={**_ERRORS, 404: {"description": "Unknown node"}},
    )
    async def lease(request: Request):
        req = await parse(request, LeaseRequest, limit)
        return respond(request, await service.lease(req))

    @app.post(
        "/leases/release",
        tags=["leases"],
        response_model=Ack,
        openapi_extra=_body(LeaseRelease),
        responses={**_ERRORS, 404: {"description": "Unknown node or lease"}},
    )
    async def release(request: Request):
        req = await parse(request, LeaseRelease, limit)
        return respond(request, await service.release(req))

    @app.post(
        "/trajectories",
        tags=["trajectories"],
        response_model=PushResult,
        openapi_extra=_body(TrajectoryPush),
        responses=_ERRORS,
        summary="Push episodes of a lease (idempotent by idempotency_key)",
    )
    async def push(request: Request):
        if request_type(request) == MSGPACK:
            req, packed = decode_push(await read_body(request, limit), limit)
        else:
            req, packed = await parse(request, TrajectoryPush, limit), {}
        return respond(request, await service.push(req, packed))

    @app.post(
        "/batches",
        tags=["batches"],
        response_model=BatchReply,
        openapi_extra=_body(BatchRequest),
        responses=_ERRORS,
        summary="Next batch for a trainer (long-polls up to wait_s)",
    )
    async def next_batch(request: Request):
        req = await parse(request, BatchRequest, limit)
        return respond_raw(request, await service.next_batch(req), BatchReply)

    @app.post(
        "/batches/{batch_id}/ack",
        tags=["batches"],
        response_model=Ack,
        openapi_extra=_body(BatchAck),
        responses={**_ERRORS, 404: {"description": "Unknown batch"}},
    )
    async def ack(batch_id: str, request: Request):
        req = await parse(request, BatchAck, limit)
        return respond(request, await service.ack(batch_id, req))

    @app.post(
        "/versions",
        tags=["versions"],
        response_model=Ack,
        openapi_extra=_body(VersionAnnouncement),
        responses=_ERRORS,
    )
    async def announce(request: Request):
        req = await parse(request, VersionAnnouncement, limit)
        return respond(request, await service.announce(req))

    @app.post(
        "/evaluations",
        tags=["evaluations"],
        response_model=EvaluationResult,
        openapi_extra=_body(EvaluationRequest),
        responses=_ERRORS,
    )
    async def request_evaluation(request: Request):
        req = await parse(request, EvaluationRequest, limit)
        return respond(request, await service.request_evaluation(req))

    @app.get("/evaluations", tags=["evaluations"], response_model=EvaluationList, responses=_ERRORS)
    async def list_evaluations(request: Request, policy: str | None = None):
        return respond(request, EvaluationList(evaluations=await service.evaluations(policy)))

    @app.get(
        "/evaluations/{eval_id}",
        tags=["evaluations"],
        response_model=EvaluationResult,
        responses={**_ERRORS, 404: {"description": "Unknown evaluation"}},
    )
    async def get_evaluation(eval_id: str, request: Request):
        return respond(request, await service.evaluation(eval_id))

    @app.get("/status", tags=["meta"], response_model=DataflowStatus, responses=_ERRORS)
    async def status(
        request: Request,
        wait_done_s: float = Query(
            0.0, ge=0.0, le=600.0, description="Long-poll: reply once the run is done, or then"
        ),
    ):
        if wait_done_s > 0:
            await service.wait_done(wait_done_s)
        return respond(request, await service.status())

    @app.get(
        "/auth/verifiers",
        tags=["meta"],
        response_model=TokenDigests,
        responses=_ERRORS,
        summary="SHA-256 digests of the run's role tokens",
    )
    async def auth_verifiers(request: Request):
        """Lets a trainer's weight server, which holds only a trainer token, check the node,
        trainer and admin tokens that fetch weights (digests of derived tokens, never of the
        secret)."""
        return respond(request, verifier.digests())

    @app.get("/recipe", tags=["meta"], summary="The run's resolved recipe", responses=_ERRORS)
    async def get_recipe(request: Request):
        """Lets a node join with only the URL and the token (``serve rollout --join``)."""
        return respond_raw(request, config.recipe.model_dump(mode="json"), Recipe)

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
                if path != "/healthz":
                    op["security"] = [{"bearer": []}]
                    op["x-roles"] = [r for r in ROLES if r in allowed_roles(path)]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
    return app
