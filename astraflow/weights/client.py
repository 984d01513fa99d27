"""Node side of the weight store: fetch what moves an engine from its version to the wanted one.

Decision rule: when the node holds version ``have`` with digest ``have_digest`` and ``have`` is at
most ``max_chain`` versions behind, every delta in between exists and chains from that digest, and
the deltas together are smaller than the snapshot, fetch the deltas; otherwise fetch the full
snapshot. Every transferred file is checked against its
length and sha256 before it is parsed, and the resulting state's digest is checked when applied
(deltas) or on load (full), so truncated or corrupted transfers are rejected, never installed.

Sources: an ``http(s)://`` URL of a trainer's weight server (bearer token; retries with backoff;
an interrupted download resumes with a ``Range`` request; ``https://`` is verified against
``ca_file`` or ``$ASTRAFLOW_CA_FILE``, and a failed handshake is not retried) or a shared directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from astraflow.protocol.tls import client_verify, tls_failure
from astraflow.weights.delta import DeltaChain, DeltaError, SparseDelta
from astraflow.weights.digest import bytes_digest, state_digest
from astraflow.weights.store import WeightStore, WeightStoreError
from astraflow.weights.update import WeightUpdate


class WeightTransferError(RuntimeError):
    """A transfer that failed, was truncated, or whose bytes do not match their digest."""


class WeightClient:
    def __init__(
        self,
        source: str | Path,
        token: str | None = None,
        *,
        max_chain: int = 4,
        timeout: float = 60.0,
        retries: int = 4,
        backoff: float = 0.25,
        ca_file: str | Path | None = None,
    ):
        self.source = str(source)
        self.max_chain = max_chain
        self.retries = retries
        self.backoff = backoff
        self._http = None
        self._store: WeightStore | None = None
        if self.source.startswith(("http://", "https://")):
            import httpx

            headers = {"Authorization": f"Bearer {token}"} if token else {}
            https = self.source.startswith("https://")
            self._http = httpx.Client(
                base_url=self.source.rstrip("/"),
                headers=headers,
                timeout=timeout,
                transport=_tls_checked_transport(
                    client_verify(ca_file) if https else True, self.source
                ),
            )
        else:
            root = Path(self.source)
            if not root.is_dir():
                raise WeightStoreError(
                    f"weight source {self.source!r} is neither an http(s) URL nor a directory"
                )
            self._store = WeightStore(root)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> WeightClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- metadata
    def meta(self, policy: str, version: int | None = None) -> dict[str, Any] | None:
        """meta.json of ``version`` (latest when None); None when the policy has no versions."""
        if self._store is not None:
            if version is None:
                versions = self._store.versions(policy)
                if not versions:
                    return None
                version = versions[-1]
            return self._store.meta(policy, version)
        path = (
            f"/weights/{policy}/latest" if version is None else f"/weights/{policy}/{version}/meta"
        )
        resp = self._request(path)
        if resp.status_code == 404:
            if version is None:
                return None
            raise WeightStoreError(f"policy {policy!r} has no version {version} at {self.source}")
        return resp.json()

    # ----------------------------------------------------------------- the update
    def fetch_update(
        self,
        policy: str,
        have_version: int | None = None,
        have_digest: str | None = None,
        want_version: int | None = None,
    ) -> WeightUpdate | None:
        """Update from ``have_version`` to ``want_version`` (latest when None).

        Without ``have_digest`` the node is trusted to hold the store's ``have_version``; the
        delta's ``apply_`` still checks the parent digest and raises ``DeltaError`` if it does not
        (the caller then asks again with ``have_version=None`` for the full snapshot).
        Returns None when the node already holds the wanted version (same digest) or the policy
        has no versions yet.
        """
        want = self.meta(policy, want_version)
        if want is None:
            return None
        target = int(want["version"])
        if have_version == target and (have_digest is None or have_digest == want["digest"]):
            return None
        chain = self._delta_chain(policy, have_version, have_digest, target, want)
        if chain is not None:
            return WeightUpdate(
                version=target, delta=chain, parent=have_version, digest=want["digest"]
            )
        return WeightUpdate(
            version=target, full=self.fetch_full(policy, target, want), digest=want["digest"]
        )

    def fetch_full(
        self, policy: str, version: int, meta: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The verified full state of ``version`` as CPU tensors."""
        from safetensors.torch import load

        meta = meta or self.meta(policy, version)
        data = self._fetch_file(policy, version, "full", meta["full_bytes"], meta["full_sha256"])
        try:
            state = load(data)
        except Exception as exc:
            raise WeightTransferError(
                f"full snapshot of {policy} v{version} is unreadable: {exc}"
            ) from exc
        got = state_digest(state)
        if got != meta["digest"]:
            raise WeightTransferError(
                f"full snapshot of {policy} v{version} has digest {got}, expected {meta['digest']}"
            )
        return state

    def _delta_chain(
        self,
        policy: str,
        have: int | None,
        have_digest: str | None,
        target: int,
        target_meta: dict[str, Any] | None = None,
    ) -> DeltaChain | None:
        if have is None or not 0 < target - have <= self.max_chain:
            return None
        metas = []
        for v in range(have + 1, target + 1):
            if v == target and target_meta is not None:
                m = target_meta  # just read by the caller: one round trip fewer
            else:
                try:
                    m = self.meta(policy, v)
                except WeightStoreError:
                    return None  # garbage-collected: fall back to the snapshot
            if m.get("parent") != v - 1 or not m.get("delta_sha256"):
                return None
            metas.append(m)
        if sum(int(m["delta_bytes"]) for m in metas) >= int(metas[-1]["full_bytes"]):
            return None  # the snapshot is no bigger (e.g. fp32 after a large step): take it
        deltas = []
        for m in metas:
            v = int(m["version"])
            data = self._fetch_file(policy, v, "delta", m["delta_bytes"], m["delta_sha256"])
            try:
                delta = SparseDelta.from_bytes(data)
            except DeltaError as exc:
                raise WeightTransferError(f"delta of {policy} v{v}: {exc}") from exc
            if delta.digest != m["digest"]:
                raise WeightTransferError(
                    f"delta of {policy} v{v} does not produce the version's digest"
                )
            deltas.append(delta)
        if have_digest is not None and deltas[0].parent_digest != have_digest:
            return None  # the node's state is not the store's v{have}: take the snapshot
        try:
            return DeltaChain(deltas)
        except DeltaError as exc:
            raise WeightTransferError(f"deltas of {policy} do not chain: {exc}") from exc

    # ----------------------------------------------------------------- transport
    def _fetch_file(self, policy: str, version: int, kind: str, size: int, sha256: str) -> bytes:
        if self._store is not None:
            try:
                if kind == "full":
                    data = self._store.read_full(policy, version)
                else:
                    data = self._store.read_delta(policy, version) or b""
            except (OSError, WeightStoreError) as exc:
                raise WeightTransferError(
                    f"cannot read {kind} of {policy} v{version}: {exc}"
                ) from exc
        else:
            data = self._download(f"/weights/{policy}/{version}/{kind}", size)
        check_bytes(data, size, sha256, f"{kind} of {policy} v{version}")
        return data

    def _download(self, path: str, size: int) -> bytes:
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
                    if resp.status_code == 401:
                        raise WeightTransferError(f"weight server refused the token for {path}")
                    if resp.status_code == 404:
                        raise WeightTransferError(f"{path} not found on the weight server")
                    if resp.status_code >= 500:
                        raise httpx.TransportError(f"server error {resp.status_code}")
                    if resp.status_code not in (200, 206):
                        raise WeightTransferError(f"GET {path}: HTTP {resp.status_code}")
                    if buf and not _resumes_at(resp, len(buf)):
                        buf.clear()  # the server ignored the range: start over
                    for chunk in resp.iter_bytes():
                        buf.extend(chunk)
                        if len(buf) > size:
                            raise WeightTransferError(
                                f"{path}: more than the announced {size} bytes"
                            )
                return bytes(buf)
            except httpx.TransportError as exc:
                if len(buf) > before:
                    attempt = 0  # the connection broke, but bytes came: resume, no penalty
                attempt += 1
                if attempt > self.retries:
                    raise WeightTransferError(
                        f"GET {path} failed after {self.retries} retries: {exc}"
                    ) from exc
                time.sleep(self.backoff * 2 ** (attempt - 1))

    def _request(self, path: str):
        import httpx

        attempt = 0
        while True:
            try:
                resp = self._http.get(path)
                if resp.status_code == 401:
                    raise WeightTransferError(f"weight server refused the token for {path}")
                if resp.status_code >= 500:
                    raise httpx.TransportError(f"server error {resp.status_code}")
                if resp.status_code not in (200, 404):
                    raise WeightTransferError(
                        f"GET {path}: HTTP {resp.status_code}: {resp.text[:200]}"
                    )
                return resp
            except httpx.TransportError as exc:
                attempt += 1
                if attempt > self.retries:
                    raise WeightTransferError(
                        f"GET {path} failed after {self.retries} retries: {exc}"
                    ) from exc
                time.sleep(self.backoff * 2 ** (attempt - 1))


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


def check_bytes(data: bytes, size: int, sha256: str, what: str) -> None:
    """Reject a transfer whose length or sha256 differs from what the store announced."""
    if len(data) != size:
        raise WeightTransferError(
            f"{what} is truncated or padded: {len(data)} bytes, expected {size}"
        )
    got = bytes_digest(data)
    if got != sha256:
        raise WeightTransferError(f"{what} is corrupt: sha256 {got}, expected {sha256}")
