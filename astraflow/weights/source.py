"""Where a node reads weight versions from: the :class:`WeightSource` interface and its two backends.

A source answers two questions, and nothing else: a version's ``meta.json`` and the raw bytes of
one of its files (``full`` snapshot or ``delta``). What to fetch (the delta chain or the snapshot)
and checking every byte against its announced length and sha256 is the
:class:`~astraflow.weights.client.WeightClient`'s job, the same for every source, so a new backend
(an object store, a peer) only implements these two reads.

* :class:`HTTPWeightSource`: an ``http(s)://`` URL of a trainer's weight server or a region's weight
  cache (bearer token; retries with backoff; an interrupted download resumes with a ``Range``
  request; ``https://`` is verified against ``ca_file`` or ``$ASTRAFLOW_CA_FILE``, and a failed
  handshake is not retried).
* :class:`DirectoryWeightSource`: a weight store directory the node can read (a shared file system).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from astraflow.errors import AstraFlowError
from astraflow.protocol.tls import client_verify, tls_failure
from astraflow.weights.store import WeightStore, WeightStoreError

#: The files of a version a source serves.
FileKind = Literal["full", "delta"]
#: sees each chunk of a download as it arrives, and None when the transfer starts over
ChunkSink = Callable[[bytes | None], None]


class WeightTransferError(AstraFlowError, RuntimeError):
    """A transfer that failed, was truncated, or whose bytes do not match their digest."""


@runtime_checkable
class WeightSource(Protocol):
    """The reads a :class:`~astraflow.weights.client.WeightClient` needs from a weight store."""

    #: what the source is, for messages (a URL or a directory)
    location: str

    def meta(self, policy: str, version: int | None = None) -> dict[str, Any] | None:
        """meta.json of ``version`` (latest when None); None when the policy has no versions yet.
        A ``version`` the source does not have raises :class:`WeightStoreError`."""
        ...

    def read(
        self, policy: str, version: int, kind: FileKind, size: int, sink: ChunkSink | None = None
    ) -> bytes:
        """The bytes of the version's ``kind`` file, announced as ``size`` bytes (unchecked: the
        client verifies length and sha256). ``sink`` sees each chunk as it arrives, and None when
        the transfer starts over. Raises :class:`WeightTransferError` when unreadable."""
        ...

    def close(self) -> None: ...


class DirectoryWeightSource:
    """A weight store directory read in place (:class:`~astraflow.weights.store.WeightStore`)."""

    def __init__(self, root: str | Path) -> None:
        root = Path(root)
        if not root.is_dir():
            raise WeightStoreError(
                f"weight source {str(root)!r} is neither an http(s) URL nor a directory"
            )
        self.location = str(root)
        self._store = WeightStore(root)

    def meta(self, policy: str, version: int | None = None) -> dict[str, Any] | None:
        if version is None:
            versions = self._store.versions(policy)
            if not versions:
                return None
            version = versions[-1]
        return self._store.meta(policy, version)

    def read(
        self, policy: str, version: int, kind: FileKind, size: int, sink: ChunkSink | None = None
    ) -> bytes:
        try:
            if kind == "full":
                data = self._store.read_full(policy, version)
            else:
                data = self._store.read_delta(policy, version) or b""
        except (OSError, WeightStoreError) as exc:
            raise WeightTransferError(f"cannot read {kind} of {policy} v{version}: {exc}") from exc
        if sink is not None:
            sink(data)
        return data

    def close(self) -> None:
        pass


class HTTPWeightSource:
    """A weight server's (or weight cache's) HTTP API: ``GET /weights/POLICY/...``."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 60.0,
        retries: int = 4,
        backoff: float = 0.25,
        ca_file: str | Path | None = None,
    ) -> None:
        import httpx

        self.location = url
        self.retries = retries
        self.backoff = backoff
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        https = url.startswith("https://")
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=_tls_checked_transport(client_verify(ca_file) if https else True, url),
        )

    def close(self) -> None:
        self._http.close()

    def meta(self, policy: str, version: int | None = None) -> dict[str, Any] | None:
        path = (
            f"/weights/{policy}/latest" if version is None else f"/weights/{policy}/{version}/meta"
        )
        resp = self._request(path)
        if resp.status_code == 404:
            if version is None:
                return None
            raise WeightStoreError(f"policy {policy!r} has no version {version} at {self.location}")
        return resp.json()

    def read(
        self, policy: str, version: int, kind: FileKind, size: int, sink: ChunkSink | None = None
    ) -> bytes:
        return self._download(f"/weights/{policy}/{version}/{kind}", size, sink)

    def _download(self, path: str, size: int, sink: ChunkSink | None = None) -> bytes:
        """GET with retries; after a broken connection, resume from the received offset.

        Only attempts that make no progress count against ``retries``: on a lossy link that cuts
        a large transfer several times, each resumed request that brought bytes starts the count
        afresh, so the download finishes as long as it keeps moving."""
        import httpx

        buf = bytearray()
        attempt = 0
        while True:
            before = len(buf)
            headers = {"Range": f"bytes={len(buf)}-"} if buf else {}
            try:
                with self._http.stream("GET", path, headers=headers) as resp:
                    if resp.status_code == 404:
                        raise WeightTransferError(f"{path} not found on the weight server")
                    _check_status(resp, path, ok=(200, 206))
                    if buf and not _resumes_at(resp, len(buf)):
                        buf.clear()  # the server ignored the range: start over
                        if sink is not None:
                            sink(None)
                    for chunk in resp.iter_bytes():
                        buf.extend(chunk)
                        if len(buf) > size:
                            raise WeightTransferError(
                                f"{path}: more than the announced {size} bytes"
                            )
                        if sink is not None:
                            sink(chunk)
                return bytes(buf)
            except httpx.TransportError as exc:
                if len(buf) > before:
                    attempt = 0  # the connection broke, but bytes came: resume, no penalty
                attempt += 1
                self._back_off(path, attempt, exc)

    def _request(self, path: str):
        import httpx

        attempt = 0
        while True:
            try:
                resp = self._http.get(path)
                _check_status(resp, path, ok=(200, 404))
                return resp
            except httpx.TransportError as exc:
                attempt += 1
                self._back_off(path, attempt, exc)

    def _back_off(self, path: str, attempt: int, exc: Exception) -> None:
        """Wait before the next try (exponential), or give up once ``retries`` are spent."""
        if attempt > self.retries:
            raise WeightTransferError(
                f"GET {path} failed after {self.retries} retries: {exc}"
            ) from exc
        time.sleep(self.backoff * 2 ** (attempt - 1))


def _check_status(resp: Any, path: str, ok: tuple[int, ...]) -> None:
    """A refused token or an unexpected status is an error naming the path; a server error is a
    transport error, retried like a broken connection."""
    import httpx

    if resp.status_code == 401:
        raise WeightTransferError(f"weight server refused the token for {path}")
    if resp.status_code >= 500:
        raise httpx.TransportError(f"server error {resp.status_code}")
    if resp.status_code not in ok:
        try:
            detail = f": {resp.text[:200]}"
        except httpx.ResponseNotRead:  # a streamed response: its body is not read for this
            detail = ""
        raise WeightTransferError(f"GET {path}: HTTP {resp.status_code}{detail}")


def open_weight_source(
    source: str | Path | WeightSource, token: str | None = None, **http: Any
) -> WeightSource:
    """The backend for ``source``: an ``http(s)://`` URL, a store directory, or a ready
    :class:`WeightSource` (returned as is). ``http`` goes to :class:`HTTPWeightSource`."""
    if isinstance(source, WeightSource):
        return source
    text = str(source)
    if text.startswith(("http://", "https://")):
        return HTTPWeightSource(text, token, **http)
    return DirectoryWeightSource(text)


def _tls_checked_transport(verify, source: str):
    """httpx's transport, except that a failed TLS handshake raises :class:`WeightTransferError`
    (not retried by the download loops: it cannot succeed on a second try) naming what to fix."""
    import httpx

    class Transport(httpx.HTTPTransport):
        def handle_request(self, request):
            try:
                return super().handle_request(request)
            except httpx.TransportError as exc:
                reason = tls_failure(exc)
                if reason is not None:
                    raise WeightTransferError(f"weight server {source}: {reason}") from exc
                raise

    return Transport(verify=verify)


def _resumes_at(resp, offset: int) -> bool:
    """Whether ``resp`` is a 206 whose Content-Range starts at ``offset``."""
    if resp.status_code != 206:
        return False
    unit, _, spec = resp.headers.get("content-range", "").partition(" ")
    start = spec.split("-", 1)[0]
    return unit == "bytes" and start.isdigit() and int(start) == offset
