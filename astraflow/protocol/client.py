"""Client of the dataflow service's HTTP API, used by rollout nodes, trainers and the CLI.

Two flavours with the same methods: :class:`DataflowClient` (async, ``httpx.AsyncClient``) for
rollout nodes, and :class:`SyncDataflowClient` (``httpx.Client``) for a trainer thread or scripts.

Bodies are msgpack. Network errors and 5xx replies are retried with exponential backoff; each
request body is encoded once, so a retry carries the SAME idempotency key and the service applies
it at most once (a retried push whose first attempt did land is answered ``duplicate=True``).

``https://`` services are verified against ``ca_file`` (else ``$ASTRAFLOW_CA_FILE``, else the
system trust store; see :mod:`astraflow.protocol.tls`). A failed TLS handshake is not retried: it
cannot succeed on a second try, and the error says which CA file to give.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from astraflow.errors import AstraFlowError
from astraflow.protocol import routes
from astraflow.protocol.auth import TokenDigests
from astraflow.protocol.codec import JSON, MSGPACK, DecodeError, decode, decode_obj, encode
from astraflow.protocol.messages import (
    NODE_KEY_HEADER,
    Ack,
    BatchAck,
    BatchReply,
    BatchRequest,
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
)
from astraflow.protocol.models import WeightVersion, new_id
from astraflow.protocol.routes import Endpoint
from astraflow.protocol.status import DataflowStatus
from astraflow.protocol.tls import client_verify, tls_failure
from astraflow.protocol.transcripts import TranscriptList
from astraflow.recipe.schema import Recipe

M = TypeVar("M", bound=BaseModel)

RETRY_STATUS = frozenset({500, 502, 503, 504})


class DataflowClientError(AstraFlowError, RuntimeError):
    """Base of every error this client raises."""


class AuthError(DataflowClientError):
    """HTTP 401: the token is not the run's secret nor one of its role tokens."""


class TLSError(DataflowClientError):
    """The TLS handshake failed (unverifiable certificate, plain HTTP behind an https:// URL)."""


class ServiceUnreachable(DataflowClientError):
    """The service could not be reached (or kept failing with 5xx) after all retries."""


class RequestRejected(DataflowClientError):
    """The service refused the request (4xx): ``status``, ``detail`` and the offending ``fields``."""

    def __init__(self, status: int, detail: str, fields: list[str] | None = None):
        self.status = status
        self.detail = detail
        self.fields = fields or []
        where = f" (fields: {', '.join(self.fields)})" if self.fields else ""
        super().__init__(f"HTTP {status}: {detail}{where}")


class NotFoundError(RequestRejected):
    """HTTP 404: unknown node, lease, batch or evaluation."""


class ForbiddenError(RequestRejected):
    """HTTP 403: a valid token whose role may not call this route (e.g. a node token acking)."""


@dataclass
class _Call:
    method: str
    path: str
    body: bytes | None = None
    reply: type[BaseModel] | None = None
    extra_timeout: float = 0.0
    params: dict[str, str] | None = None
    headers: dict[str, str] | None = None


def _call(
    ep: Endpoint,
    body: BaseModel | None = None,
    *,
    wait: float = 0.0,
    params: dict[str, str] | None = None,
    raw: bool = False,
    **path: str,
) -> _Call:
    """A request to endpoint ``ep`` (:mod:`astraflow.protocol.routes`): its method and path (with
    ``path`` filled in), the body encoded once (a retry sends the same bytes, the same
    idempotency key), its reply type (``raw``: plain data instead) and, for a long poll, ``wait``:
    how long the service may hold the reply back, added to the timeout."""
    if wait and not ep.long_poll:
        raise ValueError(f"{ep.method} {ep.path} is not a long poll")
    data = None if body is None else encode(body, MSGPACK)
    return _Call(ep.method, ep.url(**path), data, None if raw else ep.reply, wait, params)


def _status_call(wait_done_s: float) -> _Call:
    params = {"wait_done_s": repr(float(wait_done_s))} if wait_done_s > 0 else None
    return _call(routes.STATUS, params=params, wait=wait_done_s)


def _transcripts_call(step: int | None, failed: bool | None, limit: int) -> _Call:
    params = {"limit": str(limit)}
    if step is not None:
        params["step"] = str(step)
    if failed is not None:
        params["failed"] = "true" if failed else "false"
    return _call(routes.TRANSCRIPTS, params=params)


def _model(cls: type[M], obj: M | None, fields: dict[str, Any]) -> M:
    if obj is not None:
        if fields:
            raise TypeError(f"pass either a {cls.__name__} or keyword fields, not both")
        return obj
    return cls(**fields)


class _ClientBase:
    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        ca_file: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # plain http:// ignores TLS settings (a stale $ASTRAFLOW_CA_FILE must not break it)
        self.verify = client_verify(ca_file) if self.base_url.startswith("https://") else True
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.headers = {
            "authorization": f"Bearer {token}",
            "content-type": MSGPACK,
            "accept": MSGPACK,
        }
        #: node id -> the credential its registration returned (sent when it deregisters)
        self.node_keys: dict[str, str] = {}

    # -- request builders (shared) -------------------------------------------------------------
    def _register(self, reg):
        return _call(routes.REGISTER, reg)

    def _deregister(self, node_id: str, node_key: str | None) -> _Call:
        key = node_key if node_key is not None else self.node_keys.get(node_id)
        call = _call(routes.DEREGISTER, node_id=node_id)
        if key:
            call.headers = {NODE_KEY_HEADER: key}
        return call

    def _remember_key(self, reg: NodeRegistered) -> NodeRegistered:
        if reg.node_key:
            self.node_keys[reg.node_id] = reg.node_key
        return reg

    def _heartbeat(self, node_id, hb):
        return _call(routes.HEARTBEAT, hb, node_id=node_id)

    def _lease(self, req: LeaseRequest):
        if req.idempotency_key is None:
            req = req.model_copy(update={"idempotency_key": new_id("lease-req")})
        # the request may wait up to wait_s at the service before the reply starts
        return _call(routes.LEASE, req, wait=req.wait_s)

    def _next_batch(self, req: BatchRequest):
        return _call(routes.NEXT_BATCH, req, wait=req.wait_s)

    # -- reply handling (shared) ---------------------------------------------------------------
    def _delay(self, attempt: int) -> float:
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return base * (0.5 + random.random() / 2)

    def _tls_error(self, exc: Exception) -> TLSError | None:
        reason = tls_failure(exc)
        return (
            None if reason is None else TLSError(f"dataflow service at {self.base_url}: {reason}")
        )

    def _unreachable(self, call: _Call, last: Exception | str) -> ServiceUnreachable:
        return ServiceUnreachable(
            f"dataflow service at {self.base_url} unreachable ({call.method} {call.path}) after "
            f"{self.retries + 1} attempt(s): {last}"
        )

    @staticmethod
    def _error_detail(resp: httpx.Response) -> tuple[str, list[str]]:
        ctype = resp.headers.get("content-type", "")
        try:
            body = (
                decode_obj(resp.content) if ctype.startswith(MSGPACK) else json.loads(resp.content)
            )
        except Exception:
            return resp.text[:500] or resp.reason_phrase, []
        if isinstance(body, dict):
            return str(body.get("detail", body)), list(body.get("fields") or [])
        return str(body), []

    def _finish(self, call: _Call, resp: httpx.Response) -> Any:
        if resp.status_code == 401:
            raise AuthError(
                f"wrong run token for the dataflow service at {self.base_url} "
                f"({self._error_detail(resp)[0]})"
            )
        if resp.status_code >= 400:
            detail, fields = self._error_detail(resp)
            cls = {404: NotFoundError, 403: ForbiddenError}.get(resp.status_code, RequestRejected)
            raise cls(resp.status_code, detail, fields)
        ctype = resp.headers.get("content-type", JSON)
        if call.reply is None:
            if ctype.startswith(MSGPACK):
                return decode_obj(resp.content)
            return json.loads(resp.content)
        try:
            return decode(
                call.reply,
                resp.content,
                MSGPACK if ctype.startswith(MSGPACK) else JSON,
                max_bytes=1 << 40,
            )
        except DecodeError as exc:
            raise DataflowClientError(
                f"unexpected reply to {call.method} {call.path}: {exc}"
            ) from exc


class DataflowClient(_ClientBase):
    """Async client; use as ``async with DataflowClient(url, token) as client: ...``.

    ``max_connections`` is small on purpose: calls to the service take milliseconds, so a few
    keep-alive connections carry a whole node, while httpcore checks every pooled connection for
    every queued request (profiled: with 64 connections that bookkeeping was 20% of a rollout
    node's event-loop CPU, taken from the engine sharing its core). A node parks at most one
    long-polling lease request (``wait_s``), which holds one connection; heartbeats, pushes and
    the rest share the others, so a parked lease never delays a heartbeat.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        max_connections: int = 8,
        ca_file: str | None = None,
    ) -> None:
        super().__init__(base_url, token, timeout, retries, backoff_s, max_backoff_s, ca_file)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self.headers,
            timeout=timeout,
            verify=self.verify,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    async def __aenter__(self) -> DataflowClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _execute(self, call: _Call) -> Any:
        last: Exception | str = ""
        for attempt in range(self.retries + 1):
            try:
                resp = await self._http.request(
                    call.method,
                    call.path,
                    content=call.body,
                    params=call.params,
                    headers=call.headers,
                    timeout=self.timeout + call.extra_timeout,
                )
            except httpx.TransportError as exc:
                if (tls := self._tls_error(exc)) is not None:
                    raise tls from exc
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code not in RETRY_STATUS:
                    return self._finish(call, resp)
                last = f"HTTP {resp.status_code}: {self._error_detail(resp)[0]}"
            if attempt < self.retries:
                await asyncio.sleep(self._delay(attempt))
        raise self._unreachable(call, last)

    # -- API -----------------------------------------------------------------------------------
    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        reply: type[BaseModel] | None = None,
        extra_timeout: float = 0.0,
    ) -> Any:
        """Low-level call with an already msgpack-encoded body (benchmarks, proxies); returns
        ``reply`` decoded, or plain data when ``reply`` is None. Retries like every method."""
        return await self._execute(_Call(method, path, body, reply, extra_timeout))

    async def healthz(self) -> dict:
        return await self._execute(_call(routes.HEALTHZ))

    async def register(self, reg: NodeRegistration | None = None, **fields) -> NodeRegistered:
        return self._remember_key(
            await self._execute(self._register(_model(NodeRegistration, reg, fields)))
        )

    async def heartbeat(
        self, node_id: str, hb: Heartbeat | None = None, **fields
    ) -> HeartbeatReply:
        return await self._execute(self._heartbeat(node_id, _model(Heartbeat, hb, fields)))

    async def deregister(self, node_id: str, node_key: str | None = None) -> Ack:
        """``node_key``: the credential the registration returned (default: the one this client
        received for ``node_id``); a node token may deregister only its own node."""
        return await self._execute(self._deregister(node_id, node_key))

    async def lease(self, req: LeaseRequest | None = None, **fields) -> LeaseGrant:
        return await self._execute(self._lease(_model(LeaseRequest, req, fields)))

    async def release(self, node_id: str, lease_ids: list[str]) -> Ack:
        req = LeaseRelease(node_id=node_id, lease_ids=list(lease_ids))
        return await self._execute(_call(routes.RELEASE, req))

    async def push(self, req: TrajectoryPush | None = None, **fields) -> PushResult:
        return await self._execute(_call(routes.PUSH, _model(TrajectoryPush, req, fields)))

    async def save_partials(self, req: PartialPush | None = None, **fields) -> PartialResult:
        return await self._execute(_call(routes.PARTIALS, _model(PartialPush, req, fields)))

    async def next_batch(self, req: BatchRequest | None = None, **fields) -> BatchReply:
        return await self._execute(self._next_batch(_model(BatchRequest, req, fields)))

    async def ack(self, batch_id: str, ack: BatchAck | None = None, **fields) -> Ack:
        return await self._execute(
            _call(routes.ACK, _model(BatchAck, ack, fields), batch_id=batch_id)
        )

    async def announce_version(self, wv: WeightVersion | None = None, **fields) -> Ack:
        return await self._execute(_call(routes.ANNOUNCE, _model(WeightVersion, wv, fields)))

    async def stop_run(self, reason: str = "stopped by an admin") -> Ack:
        """``POST /run/stop`` (admin token): end the run cleanly."""
        return await self._execute(_call(routes.RUN_STOP, RunStop(reason=reason)))

    async def latest_versions(self) -> LatestVersions:
        """``GET /versions/latest``: the newest version of each policy, its location and digest."""
        return await self._execute(_call(routes.LATEST_VERSIONS))

    async def request_evaluation(
        self, req: EvaluationRequest | None = None, **fields
    ) -> EvaluationResult:
        return await self._execute(
            _call(routes.REQUEST_EVALUATION, _model(EvaluationRequest, req, fields))
        )

    async def evaluations(self, policy: str | None = None) -> list[EvaluationResult]:
        call = _call(routes.LIST_EVALUATIONS, params={"policy": policy} if policy else None)
        return (await self._execute(call)).evaluations

    async def evaluation(self, eval_id: str) -> EvaluationResult:
        return await self._execute(_call(routes.GET_EVALUATION, eval_id=eval_id))

    async def status(self, wait_done_s: float = 0.0) -> DataflowStatus:
        """``GET /status``; with ``wait_done_s``, answered as soon as the run is done (or then)."""
        return await self._execute(_status_call(wait_done_s))

    async def transcripts(
        self, step: int | None = None, failed: bool | None = None, limit: int = 50
    ) -> TranscriptList:
        """``GET /transcripts``: the sampled finished episodes (admin)."""
        return await self._execute(_transcripts_call(step, failed, limit))

    async def auth_verifiers(self) -> TokenDigests:
        """Digests of the run's role tokens (``GET /auth/verifiers``; trainer or admin)."""
        return await self._execute(_call(routes.AUTH_VERIFIERS))

    async def recipe(self) -> Recipe:
        """The run's resolved recipe (``GET /recipe``), so a node needs only URL and token."""
        return Recipe.model_validate(await self._execute(_call(routes.RECIPE, raw=True)))


class SyncDataflowClient(_ClientBase):
    """Blocking client with the same methods, for a trainer thread or scripts."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        ca_file: str | None = None,
    ) -> None:
        super().__init__(base_url, token, timeout, retries, backoff_s, max_backoff_s, ca_file)
        self._http = httpx.Client(
            base_url=self.base_url, headers=self.headers, timeout=timeout, verify=self.verify
        )

    def __enter__(self) -> SyncDataflowClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _execute(self, call: _Call) -> Any:
        last: Exception | str = ""
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(
                    call.method,
                    call.path,
                    content=call.body,
                    params=call.params,
                    headers=call.headers,
                    timeout=self.timeout + call.extra_timeout,
                )
            except httpx.TransportError as exc:
                if (tls := self._tls_error(exc)) is not None:
                    raise tls from exc
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code not in RETRY_STATUS:
                    return self._finish(call, resp)
                last = f"HTTP {resp.status_code}: {self._error_detail(resp)[0]}"
            if attempt < self.retries:
                time.sleep(self._delay(attempt))
        raise self._unreachable(call, last)

    def healthz(self) -> dict:
        return self._execute(_call(routes.HEALTHZ))

    def register(self, reg: NodeRegistration | None = None, **fields) -> NodeRegistered:
        return self._remember_key(
            self._execute(self._register(_model(NodeRegistration, reg, fields)))
        )

    def heartbeat(self, node_id: str, hb: Heartbeat | None = None, **fields) -> HeartbeatReply:
        return self._execute(self._heartbeat(node_id, _model(Heartbeat, hb, fields)))

    def deregister(self, node_id: str, node_key: str | None = None) -> Ack:
        return self._execute(self._deregister(node_id, node_key))

    def lease(self, req: LeaseRequest | None = None, **fields) -> LeaseGrant:
        return self._execute(self._lease(_model(LeaseRequest, req, fields)))

    def release(self, node_id: str, lease_ids: list[str]) -> Ack:
        req = LeaseRelease(node_id=node_id, lease_ids=list(lease_ids))
        return self._execute(_call(routes.RELEASE, req))

    def push(self, req: TrajectoryPush | None = None, **fields) -> PushResult:
        return self._execute(_call(routes.PUSH, _model(TrajectoryPush, req, fields)))

    def save_partials(self, req: PartialPush | None = None, **fields) -> PartialResult:
        return self._execute(_call(routes.PARTIALS, _model(PartialPush, req, fields)))

    def next_batch(self, req: BatchRequest | None = None, **fields) -> BatchReply:
        return self._execute(self._next_batch(_model(BatchRequest, req, fields)))

    def ack(self, batch_id: str, ack: BatchAck | None = None, **fields) -> Ack:
        return self._execute(_call(routes.ACK, _model(BatchAck, ack, fields), batch_id=batch_id))

    def announce_version(self, wv: WeightVersion | None = None, **fields) -> Ack:
        return self._execute(_call(routes.ANNOUNCE, _model(WeightVersion, wv, fields)))

    def request_evaluation(
        self, req: EvaluationRequest | None = None, **fields
    ) -> EvaluationResult:
        return self._execute(
            _call(routes.REQUEST_EVALUATION, _model(EvaluationRequest, req, fields))
        )

    def evaluations(self, policy: str | None = None) -> list[EvaluationResult]:
        call = _call(routes.LIST_EVALUATIONS, params={"policy": policy} if policy else None)
        return self._execute(call).evaluations

    def evaluation(self, eval_id: str) -> EvaluationResult:
        return self._execute(_call(routes.GET_EVALUATION, eval_id=eval_id))

    def status(self, wait_done_s: float = 0.0) -> DataflowStatus:
        """``GET /status``; with ``wait_done_s``, answered as soon as the run is done (or then)."""
        return self._execute(_status_call(wait_done_s))

    def transcripts(
        self, step: int | None = None, failed: bool | None = None, limit: int = 50
    ) -> TranscriptList:
        """``GET /transcripts``: the sampled finished episodes (admin)."""
        return self._execute(_transcripts_call(step, failed, limit))

    def auth_verifiers(self) -> TokenDigests:
        """Digests of the run's role tokens (``GET /auth/verifiers``; trainer or admin)."""
        return self._execute(_call(routes.AUTH_VERIFIERS))

    def stop_run(self, reason: str = "stopped by an admin") -> Ack:
        """``POST /run/stop`` (admin token): end the run cleanly."""
        return self._execute(_call(routes.RUN_STOP, RunStop(reason=reason)))

    def latest_versions(self) -> LatestVersions:
        """``GET /versions/latest``: the newest version of each policy, its location and digest."""
        return self._execute(_call(routes.LATEST_VERSIONS))

    def recipe(self) -> Recipe:
        """The run's resolved recipe (``GET /recipe``)."""
        return Recipe.model_validate(self._execute(_call(routes.RECIPE, raw=True)))
