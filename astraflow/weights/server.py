"""HTTP endpoint of a weight store, hosted by the trainer process.

Files go out as :class:`starlette.responses.FileResponse`, which streams from disk and honours
``Range`` requests, so a client can resume an interrupted download. Each file response names the
version's state digest and the file's sha256 in headers; clients verify both. Every route except
``GET /healthz`` needs ``Authorization: Bearer <token>``: every route only reads, so any token of
the run is accepted (node, trainer, admin; see :mod:`astraflow.protocol.auth`). Given a
:class:`~astraflow.protocol.tls.ServerTLS`, the server speaks HTTPS.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import FileResponse

from astraflow.protocol.auth import TokenVerifier, bearer
from astraflow.protocol.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from astraflow.protocol.prometheus import ServiceMetrics, exposition
from astraflow.protocol.tls import ServerTLS
from astraflow.weights.store import WeightStore, WeightStoreError

DIGEST_HEADER = "X-Astraflow-Digest"
SHA256_HEADER = "X-Astraflow-Sha256"
PARENT_HEADER = "X-Astraflow-Parent"


class WeightFileResponse(FileResponse):
    """A :class:`FileResponse` that sends large chunks.

    Starlette's 64 KiB default means one thread-pool read and one event-loop turn per 64 KiB. The
    server lives in the trainer process, whose training thread holds the GIL most of the time, so
    every turn waits for a GIL hand-off (up to the 5 ms switch interval): a 4.4 MB delta took ~70
    hand-offs. 4 MiB chunks cost a few hand-offs per file; ``Range`` requests still work.
    """

    chunk_size = 4 * 1024 * 1024


def create_weight_app(
    store: WeightStore, token: str | TokenVerifier, metrics: ServiceMetrics | None = None
) -> FastAPI:
    """FastAPI app serving ``store`` (see the module docstring for the routes' contract).

    ``token``: the run secret (accepts it and every role token derived from it), or a
    :class:`TokenVerifier` built from the role tokens' digests when the trainer holds only its
    trainer token. ``metrics``: the trainer's histograms, served at ``GET /metrics``."""
    if not token:
        raise ValueError("a weight server needs a non-empty bearer token")
    verifier = token if isinstance(token, TokenVerifier) else TokenVerifier.from_secret(token)
    app = FastAPI(title="AstraFlow weight store", docs_url=None, redoc_url=None)

    def require_token(request: Request) -> None:
        presented = bearer(request.headers.get("authorization"))
        if presented is None or verifier.role_of(presented) is None:
            raise HTTPException(
                status_code=401,
                detail="missing or wrong bearer token (send 'Authorization: Bearer <token>' with "
                "a node, trainer or admin token of the run)",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def meta_or_404(policy: str, version: int) -> dict:
        try:
            return store.meta(policy, version)
        except WeightStoreError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from exc

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True}

    served = metrics or ServiceMetrics()
    downloads = served.counter(
        "astraflow_weight_downloads", "Weight files served, by kind (full, delta)", ("kind",)
    )

    @app.get("/metrics", dependencies=[Depends(require_token)], include_in_schema=False)
    def prometheus_metrics() -> Response:
        return Response(exposition(served.registry), media_type=PROMETHEUS_CONTENT_TYPE)

    @app.get("/weights/{policy}/latest", dependencies=[Depends(require_token)])
    def latest(policy: str) -> dict:
        try:
            versions = store.versions(policy)
        except WeightStoreError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        if not versions:
            raise HTTPException(status_code=404, detail=f"policy {policy!r} has no versions yet")
        return store.meta(policy, versions[-1])

    @app.get("/weights/{policy}/versions", dependencies=[Depends(require_token)])
    def versions(policy: str) -> dict:
        try:
            return {"policy": policy, "versions": store.versions(policy)}
        except WeightStoreError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc

    @app.get("/weights/{policy}/{version}/meta", dependencies=[Depends(require_token)])
    def meta(policy: str, version: int) -> dict:
        return meta_or_404(policy, version)

    @app.get("/weights/{policy}/{version}/full", dependencies=[Depends(require_token)])
    def full(policy: str, version: int) -> WeightFileResponse:
        m = meta_or_404(policy, version)
        downloads.labels("full").inc()
        return WeightFileResponse(
            store.full_path(policy, version),
            media_type="application/octet-stream",
            headers={DIGEST_HEADER: m["digest"], SHA256_HEADER: m["full_sha256"]},
        )

    @app.get("/weights/{policy}/{version}/delta", dependencies=[Depends(require_token)])
    def delta(policy: str, version: int) -> WeightFileResponse:
        m = meta_or_404(policy, version)
        path = store.delta_path(policy, version)
        if path is None or not path.is_file():
            raise HTTPException(
                status_code=404, detail=f"version {version} of {policy!r} has no delta"
            )
        downloads.labels("delta").inc()
        return WeightFileResponse(
            path,
            media_type="application/octet-stream",
            headers={
                DIGEST_HEADER: m["digest"],
                SHA256_HEADER: m["delta_sha256"],
                PARENT_HEADER: str(m["parent"]),
            },
        )

    return app


def serve_in_thread(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    timeout: float = 10.0,
    tls: ServerTLS | None = None,
) -> tuple[str, Callable[[], None]]:
    """Run ``app`` in a daemon thread beside training; returns (base URL, stop function).

    The project's one runner (:class:`~astraflow.protocol.http_server.HTTPServer`) binds the socket
    first, so ``port=0`` yields a free port known before the server starts (IPv6 hosts too).
    With ``tls`` the server speaks HTTPS and the URL is ``https://``.
    """
    from astraflow.protocol.http_server import HTTPServer

    server = HTTPServer(app, host, port, tls=tls, lifespan="off", name="weight-server")
    server.start_in_thread(timeout)
    return server.url, lambda: server.stop_thread(timeout)
