"""Every route of the dataflow service: an endpoint of the protocol's table
(:mod:`astraflow.protocol.routes`: method, path, types, roles, long poll, fast path) bound to its
handler.

Why one table: the FastAPI app (:mod:`astraflow.dataflow.http.app`, which also documents the API in
OpenAPI) and the fast path (:mod:`astraflow.dataflow.http.fastpath`, which skips FastAPI's
per-request machinery on the hottest msgpack routes) are both built from :data:`ROUTES`, so a route
cannot exist in one and decode, call or answer differently in the other. Which roles may call a path
is the access rules' job (:mod:`astraflow.dataflow.http.access`, derived from the same endpoints),
checked before either.
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

from astraflow.dataflow.http.bodies import header
from astraflow.dataflow.http.guard import ROLE_SCOPE_KEY
from astraflow.dataflow.storage.packed import decode_push
from astraflow.protocol import (
    Ack,
    BatchAck,
    BatchRequest,
    EvaluationList,
    EvaluationRequest,
    EvaluationResult,
    Heartbeat,
    HeartbeatReply,
    LatestVersions,
    LeaseGrant,
    LeaseRelease,
    LeaseRequest,
    NodeRegistered,
    NodeRegistration,
    PartialPush,
    PartialResult,
    PushResult,
    RunStop,
    TrajectoryPush,
    VersionAnnouncement,
)
from astraflow.protocol import routes as api
from astraflow.protocol.auth import ADMIN, TokenDigests, TokenVerifier
from astraflow.protocol.bounds import INT64_MAX
from astraflow.protocol.codec import JSON, MSGPACK, decode
from astraflow.protocol.messages import NODE_KEY_HEADER
from astraflow.protocol.routes import Endpoint
from astraflow.protocol.status import DataflowStatus
from astraflow.protocol.transcripts import TranscriptList
from astraflow.recipe.schema import Recipe

if TYPE_CHECKING:
    from astraflow.dataflow.ops.service import DataflowService


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
    """An endpoint of the protocol's table bound to its handler, with what only the server needs
    to know (OpenAPI tags and errors, query validation, a special decoder or reply)."""

    endpoint: Endpoint
    handler: Handler
    tags: tuple[str, ...] = ()
    errors: Mapping[int, str] = field(default_factory=dict)  # besides 401/403/413/422
    query: tuple[inspect.Parameter, ...] = ()  # query parameters, validated by FastAPI
    raw_reply: bool = False  # the handler returns a wire dict whose arrays are already packed
    document_reply: bool = True  # name ``reply`` as the response model in OpenAPI
    decoder: Decoder | None = None
    caller: bool = False  # the handler takes ``caller=Caller`` (who sent the request)

    def __post_init__(self) -> None:
        if tuple(q.name for q in self.query) != self.endpoint.query:
            raise ValueError(
                f"{self.method} {self.path}: query parameters {[q.name for q in self.query]} "
                f"differ from the endpoint's {list(self.endpoint.query)}"
            )

    @property
    def method(self) -> str:
        return self.endpoint.method

    @property
    def path(self) -> str:
        return self.endpoint.path

    @property
    def body(self) -> type[BaseModel] | None:
        """The request's protocol type (None: no body)."""
        return self.endpoint.request

    @property
    def reply(self) -> type[BaseModel] | None:
        return self.endpoint.reply

    @property
    def summary(self) -> str | None:
        return self.endpoint.summary

    @property
    def fast(self) -> bool:
        """Also served by the raw-ASGI fast path when msgpack both ways."""
        return self.endpoint.fast

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


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the token's role and, for a node, the node credential it sent."""

    role: str | None
    node_key: str | None
    #: the client's address (host), for per-caller quotas
    client: str | None = None

    @classmethod
    def of(cls, scope: dict) -> Caller:
        key = header(scope, NODE_KEY_HEADER.encode())
        host, *_ = scope.get("client") or (None,)  # (host, port) of the peer
        return cls(
            scope.get(ROLE_SCOPE_KEY),
            key.decode("latin-1") if key is not None else None,
            str(host) if host is not None else None,
        )


def _decode_push(body: bytes, content_type: str, limit: int) -> tuple[TrajectoryPush, dict]:
    """msgpack pushes keep their token arrays packed (:mod:`astraflow.dataflow.storage.packed`)."""
    if content_type == MSGPACK:
        return decode_push(body, limit)
    return decode(TrajectoryPush, body, content_type, max_bytes=limit), {}


# -- handlers ---------------------------------------------------------------------------------
async def healthz(api: Api) -> dict:
    return {"ok": True}


async def register(api: Api, reg: NodeRegistration, caller: Caller) -> NodeRegistered:
    """``replace`` retires a namesake only with its X-Node-Key (or an admin token); the caller's
    role and address set its registration quota (:mod:`astraflow.dataflow.ops.registration`)."""
    return await api.service.register(reg, caller.role, caller.node_key, caller.client)


async def heartbeat(api: Api, hb: Heartbeat, node_id: str) -> HeartbeatReply:
    return await api.service.heartbeat(node_id, hb)


async def deregister(api: Api, node_id: str, caller: Caller) -> Ack:
    """A node token must send its node's credential (X-Node-Key); an admin token need not."""
    if caller.role == ADMIN:
        return await api.service.deregister(node_id)
    return await api.service.deregister(node_id, caller.node_key or "")


async def lease(api: Api, req: LeaseRequest) -> LeaseGrant:
    return await api.service.lease(req)


async def release(api: Api, req: LeaseRelease) -> Ack:
    return await api.service.release(req)


async def push(api: Api, decoded: tuple[TrajectoryPush, dict]) -> PushResult:
    req, packed = decoded
    return await api.service.push(req, packed)


async def save_partials(api: Api, req: PartialPush) -> PartialResult:
    return await api.service.save_partials(req)


async def next_batch(api: Api, req: BatchRequest) -> dict:
    return await api.service.next_batch(req)


async def ack(api: Api, req: BatchAck, batch_id: str) -> Ack:
    return await api.service.ack(batch_id, req)


async def announce(api: Api, req: VersionAnnouncement) -> Ack:
    return await api.service.announce(req)


async def latest_versions(api: Api) -> LatestVersions:
    """Lets a region's weight cache follow each policy's weight server across trainer restarts."""
    return LatestVersions(versions=await api.service.latest_weights())


async def stop_run(api: Api, req: RunStop) -> Ack:
    return await api.service.stop_run(req)


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


async def transcripts(
    api: Api, step: int | None, failed: bool | None, limit: int
) -> TranscriptList:
    return TranscriptList(transcripts=await api.service.transcripts(step, failed, limit))


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

#: Every endpoint of the protocol's table with its handler. ``fast`` routes carry nearly all of the
#: rollout nodes' traffic.
ROUTES: tuple[Route, ...] = (
    Route(api.HEALTHZ, healthz, ("meta",)),
    # rollout nodes
    Route(
        api.REGISTER,
        register,
        ("nodes",),
        errors={429: "Too many nodes, or registrations from this caller too fast"},
        caller=True,
    ),
    Route(api.HEARTBEAT, heartbeat, ("nodes",), errors=_UNKNOWN_NODE),
    Route(
        api.DEREGISTER,
        deregister,
        ("nodes",),
        errors={**_UNKNOWN_NODE, 403: "Not this node's credential (X-Node-Key)"},
        caller=True,
    ),
    Route(api.LEASE, lease, ("leases",), errors=_UNKNOWN_NODE),
    Route(api.RELEASE, release, ("leases",), errors={404: "Unknown node or lease"}),
    Route(api.PUSH, push, ("trajectories",), decoder=_decode_push),
    Route(api.PARTIALS, save_partials, ("trajectories",), errors=_UNKNOWN_NODE),
    # trainers
    Route(api.NEXT_BATCH, next_batch, ("batches",), raw_reply=True),
    Route(api.ACK, ack, ("batches",), errors={404: "Unknown batch"}),
    Route(api.ANNOUNCE, announce, ("versions",)),
    Route(api.LATEST_VERSIONS, latest_versions, ("versions",)),
    Route(api.REQUEST_EVALUATION, request_evaluation, ("evaluations",)),
    Route(
        api.LIST_EVALUATIONS,
        list_evaluations,
        ("evaluations",),
        query=(_query("policy", str | None, None),),
    ),
    Route(api.GET_EVALUATION, get_evaluation, ("evaluations",), errors={404: "Unknown evaluation"}),
    # meta
    Route(
        api.STATUS,
        status,
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
        api.TRANSCRIPTS,
        transcripts,
        ("meta",),
        query=(
            # bounded: SQLite refuses integers past 64 bits (a 500, not the 422 it is)
            _query(
                "step",
                int | None,
                Query(None, ge=0, le=INT64_MAX, description="Weight version (step)"),
            ),
            _query("failed", bool | None, Query(None, description="Only failed (or good) ones")),
            _query("limit", int, Query(50, ge=1, le=500)),
        ),
    ),
    Route(api.AUTH_VERIFIERS, auth_verifiers, ("meta",)),
    Route(api.RUN_STOP, stop_run, ("run",)),  # admin only
    Route(api.RECIPE, get_recipe, ("meta",), raw_reply=True, document_reply=False),
)
