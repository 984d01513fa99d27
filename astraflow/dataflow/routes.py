"""Every route of the dataflow service, declared once: method, path, protocol types, handler and
whether the raw-ASGI fast path serves it.

Why one table: the FastAPI app (:mod:`astraflow.dataflow.app`, which also documents the API in
OpenAPI) and the fast path (:mod:`astraflow.dataflow.fastpath`, which skips FastAPI's per-request
machinery on the hottest msgpack routes) are both built from :data:`ROUTES`, so a route cannot
exist in one and decode, call or answer differently in the other. Which roles may call a path is
the access table's job (:mod:`astraflow.dataflow.access`), checked before either.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import msgpack
from fastapi import Query
from pydantic import BaseModel

from astraflow.dataflow.packed import decode_push
from astraflow.protocol import (
    Ack,
    BatchAck,
    BatchReply,
    BatchRequest,
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
from astraflow.protocol.auth import TokenDigests, TokenVerifier
from astraflow.protocol.codec import JSON, MSGPACK, decode
from astraflow.protocol.status import DataflowStatus
from astraflow.recipe.schema import Recipe

if TYPE_CHECKING:
    from astraflow.dataflow.service import DataflowService


@dataclass(frozen=True)
class Api:
    """What a route's handler may use: the service, the run's token verifier and its recipe."""

    service: DataflowService
    verifier: TokenVerifier
    recipe: Recipe


#: ``handler(api, [decoded body,] **path and query params) -> reply``.
Handler = Callable[..., Awaitable[Any]]
#: ``decoder(body, content type, limit) -> what the handler takes``; default: the body model.
Decoder = Callable[[bytes, str, int], Any]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    body: type[BaseModel] | None = None  # the request's protocol type (None: no body)
    reply: type[BaseModel] | None = None  # the reply's protocol type
    tags: tuple[str, ...] = ()
    summary: str | None = None
    errors: Mapping[int, str] = field(default_factory=dict)  # besides 401/403/413/422
    query: tuple[inspect.Parameter, ...] = ()  # query parameters, validated by FastAPI
    fast: bool = False  # also served by the raw-ASGI fast path when msgpack both ways
    raw_reply: bool = False  # the handler returns a wire dict whose arrays are already packed
    document_reply: bool = True  # name ``reply`` as the response model in OpenAPI
    decoder: Decoder | None = None

    @cached_property
    def path_params(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\{([^/}]+)\}", self.path))

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        """Matches a request path, capturing the path parameters by name."""
        return re.compile("^" + re.sub(r"\{([^/}]+)\}", r"(?P<\1>[^/]+)", self.path) + "$")

    def decode(self, body: bytes, content_type: str, limit: int) -> Any:
        """The body as the handler takes it; an empty body is an empty object."""
        if not body:
            body = b"{}" if content_type == JSON else msgpack.packb({})
        if self.decoder is not None:
            return self.decoder(body, content_type, limit)
        return decode(self.body, body, content_type, max_bytes=limit)


def _decode_push(body: bytes, content_type: str, limit: int) -> tuple[TrajectoryPush, dict]:
    """msgpack pushes keep their token arrays packed (:mod:`astraflow.dataflow.packed`)."""
    if content_type == MSGPACK:
        return decode_push(body, limit)
    return decode(TrajectoryPush, body, content_type, max_bytes=limit), {}


# -- handlers ---------------------------------------------------------------------------------
async def healthz(api: Api) -> dict:
    return {"ok": True}


async def register(api: Api, reg: NodeRegistration) -> NodeRegistered:
    return await api.service.register(reg)


async def heartbeat(api: Api, hb: Heartbeat, node_id: str) -> HeartbeatReply:
    return await api.service.heartbeat(node_id, hb)


async def deregister(api: Api, node_id: str) -> Ack:
    return await api.service.deregister(node_id)


async def lease(api: Api, req: LeaseRequest) -> LeaseGrant:
    return await api.service.lease(req)


async def release(api: Api, req: LeaseRelease) -> Ack:
    return await api.service.release(req)


async def push(api: Api, decoded: tuple[TrajectoryPush, dict]) -> PushResult:
    req, packed = decoded
    return await api.service.push(req, packed)


async def next_batch(api: Api, req: BatchRequest) -> dict:
    return await api.service.next_batch(req)


async def ack(api: Api, req: BatchAck, batch_id: str) -> Ack:
    return await api.service.ack(batch_id, req)


async def announce(api: Api, req: VersionAnnouncement) -> Ack:
    return await api.service.announce(req)


async def request_evaluation(api: Api, req: EvaluationRequest) -> EvaluationResult:
    return await api.service.request_evaluation(req)


async def list_evaluations(api: Api, policy: str | None) -> EvaluationList:
    return EvaluationList(evaluations=await api.service.evaluations(policy))


async def get_evaluation(api: Api, eval_id: str) -> EvaluationResult:
    return await api.service.evaluation(eval_id)


async def status(api: Api, wait_done_s: float) -> DataflowStatus:
    if wait_done_s > 0:
        await api.service.wait_done(wait_done_s)
    return await api.service.status()


async def auth_verifiers(api: Api) -> TokenDigests:
    """Lets a trainer's weight server, which holds only a trainer token, check the node,
    trainer and admin tokens that fetch weights (digests of derived tokens, never of the
    secret)."""
    return api.verifier.digests()


async def get_recipe(api: Api) -> dict:
    """Lets a node join with only the URL and the token (``serve rollout --join``)."""
    return api.recipe.model_dump(mode="json")


def _query(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


_UNKNOWN_NODE = {404: "Unknown node"}

#: Every route of the service. ``fast`` routes carry nearly all of the rollout nodes' traffic.
ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", healthz, tags=("meta",), summary="Liveness (no token needed)"),
    # rollout nodes
    Route("POST", "/nodes/register", register, NodeRegistration, NodeRegistered, ("nodes",)),
    Route(
        "POST",
        "/nodes/{node_id}/heartbeat",
        heartbeat,
        Heartbeat,
        HeartbeatReply,
        ("nodes",),
        errors=_UNKNOWN_NODE,
        fast=True,
    ),
    Route("DELETE", "/nodes/{node_id}", deregister, None, Ack, ("nodes",), errors=_UNKNOWN_NODE),
    Route(
        "POST",
        "/leases",
        lease,
        LeaseRequest,
        LeaseGrant,
        ("leases",),
        errors=_UNKNOWN_NODE,
        fast=True,
    ),
    Route(
        "POST",
        "/leases/release",
        release,
        LeaseRelease,
        Ack,
        ("leases",),
        errors={404: "Unknown node or lease"},
    ),
    Route(
        "POST",
        "/trajectories",
        push,
        TrajectoryPush,
        PushResult,
        ("trajectories",),
        summary="Push episodes of a lease (idempotent by idempotency_key)",
        fast=True,
        decoder=_decode_push,
    ),
    # trainers
    Route(
        "POST",
        "/batches",
        next_batch,
        BatchRequest,
        BatchReply,
        ("batches",),
        summary="Next batch for a trainer (long-polls up to wait_s)",
        raw_reply=True,
    ),
    Route(
        "POST",
        "/batches/{batch_id}/ack",
        ack,
        BatchAck,
        Ack,
        ("batches",),
        errors={404: "Unknown batch"},
    ),
    Route("POST", "/versions", announce, VersionAnnouncement, Ack, ("versions",)),
    Route(
        "POST",
        "/evaluations",
        request_evaluation,
        EvaluationRequest,
        EvaluationResult,
        ("evaluations",),
    ),
    Route(
        "GET",
        "/evaluations",
        list_evaluations,
        None,
        EvaluationList,
        ("evaluations",),
        query=(_query("policy", str | None, None),),
    ),
    Route(
        "GET",
        "/evaluations/{eval_id}",
        get_evaluation,
        None,
        EvaluationResult,
        ("evaluations",),
        errors={404: "Unknown evaluation"},
    ),
    # meta
    Route(
        "GET",
        "/status",
        status,
        None,
        DataflowStatus,
        ("meta",),
        query=(
            _query(
                "wait_done_s",
                float,
                Query(
                    0.0,
                    ge=0.0,
                    le=600.0,
                    description="Long-poll: reply once the run is done, or then",
                ),
            ),
        ),
    ),
    Route(
        "GET",
        "/auth/verifiers",
        auth_verifiers,
        None,
        TokenDigests,
        ("meta",),
        summary="SHA-256 digests of the run's role tokens",
    ),
    Route(
        "GET",
        "/recipe",
        get_recipe,
        None,
        Recipe,
        ("meta",),
        summary="The run's resolved recipe",
        raw_reply=True,
        document_reply=False,
    ),
)
