"""A region-local weight cache: the first node that asks for a file fetches it, the others share it.

Nodes in a remote region all need every weight version, and the link to the trainer's weight server
is the slow, lossy part of the path. ``astraflow serve weight-cache --upstream URL`` runs this cache
inside the region; nodes started with ``--weight-cache URL`` fetch from it instead of from the
location the trainer announces. The cache serves the weight server's own routes (so the node's
:class:`~astraflow.weights.client.WeightClient` is unchanged):

* ``GET /weights/{policy}/latest``, ``/versions`` and ``/{version}/meta`` are relayed upstream on
  every request (a few hundred bytes; a trainer resuming from an older checkpoint republishes
  versions with new contents, so metadata is never served stale);
* ``GET /weights/{policy}/{version}/full|delta`` is served from disk, the file being named by its
  sha256 as the upstream meta announces it (content-addressed: a republished version is a different
  file). A missing file is downloaded once, with the client's resume-on-cut, and streamed to the
  nodes that ask for it while it downloads (``streamed``; a 250 MB snapshot over a slow link
  reaches the first node as it crosses, not after); the cache keeps it only once its length and
  sha256 are verified, and a node checks the same on its side (a transfer that fails midway
  reaches the node as a cut connection, which its client resumes or retries).
* A missing *snapshot* is first rebuilt locally when it can be and the deltas still to download
  weigh less than the snapshot: the cache keeps the newest full state it has seen per policy (the
  first snapshot it downloaded) and applies the versions' deltas (cached, or downloaded once) to it, then writes the snapshot exactly as the trainer
  does (:func:`~astraflow.weights.store.snapshot_bytes`) and serves it only if its sha256 is the
  one the trainer announced (else it downloads the snapshot). Nodes of a region ask for different
  files (one up to date wants the delta, one that fell behind or just joined wants the snapshot),
  so without this both crossed the link for the same version.

So after the first snapshot only deltas cross the slow link, about one per version, whatever the
number of nodes in the region and whatever files they ask for.

Upstreams follow the run (``--join DATAFLOW_URL``): a restarted trainer serves its weights on a new
port and announces the new location with its versions. When the upstream a policy was fetched from
stops answering (or no longer has a version), the cache reads the dataflow's version table
(``GET /versions/latest``) and moves the policy to the location announced there. ``--upstream``
then only names a first guess (or maps a policy to an address as seen from the region).

Every route except ``GET /healthz`` needs the run token (``Authorization: Bearer``), which the cache
also presents upstream. Files are plain bytes (safetensors / sparse deltas); nothing is unpickled.
``GET /cache/stats`` reports :class:`~astraflow.protocol.WeightCacheStats`, and ``GET /metrics``
the same figures for Prometheus (``astraflow_weight_cache_*``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response, StreamingResponse

from astraflow.protocol import WeightCacheStats
from astraflow.protocol.prometheus import (
    CONTENT_TYPE,
    ServiceMetrics,
    exposition,
    weight_cache_families,
)
from astraflow.weights.client import WeightClient, WeightTransferError
from astraflow.weights.digest import bytes_digest
from astraflow.weights.server import (
    DIGEST_HEADER,
    PARENT_HEADER,
    SHA256_HEADER,
    WeightFileResponse,
)
from astraflow.weights.store import WeightStoreError, check_policy, snapshot_bytes

log = logging.getLogger("astraflow.weights.cache")

_SHA_RE = re.compile(r"^sha256:([0-9a-f]{64})$")


def parse_upstreams(values: list[str], required: bool = True) -> dict[str, str]:
    """``--upstream`` values: ``URL`` (every policy) or ``POLICY=URL`` (one policy's trainer);
    ``required=False`` when the cache follows a dataflow's version table (``--join``)."""
    out: dict[str, str] = {}
    for value in values:
        policy, sep, url = value.partition("=")
        if not sep or "://" in policy:
            policy, url = "*", value
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"--upstream {value!r}: expected URL or POLICY=URL with an http(s) URL"
            )
        if policy != "*":
            check_policy(policy)
        if policy in out:
            raise ValueError(f"--upstream names {policy!r} twice")
        out[policy] = url.rstrip("/")
    if not out and required:
        raise ValueError("a weight cache needs --join DATAFLOW_URL or at least one --upstream")
    return out


#: Bytes a streamed response sends per read of the growing file.
STREAM_CHUNK = 1024 * 1024


class _Transfer:
    """A download under way: how many bytes of it are on disk, for the nodes streamed meanwhile.

    The download runs in a worker thread and reports progress through ``report`` (thread-safe);
    readers on the event loop wait for progress on an event, never poll."""

    def __init__(self, partial: Path, final: Path, size: int):
        self.partial, self.final, self.size = partial, final, size
        self.written = 0
        self.done = False
        self.error: str | None = None
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    # -- the downloading thread
    def report(self, written: int) -> None:
        self._loop.call_soon_threadsafe(self._progress, written)

    # -- the event loop
    def _progress(self, written: int) -> None:
        self.written = written
        self._changed.set()
        self._changed = asyncio.Event()

    def finish(self, error: str | None) -> None:
        self.done, self.error = True, error
        self._progress(self.written)

    def open(self) -> int:
        """A descriptor of the file being written (or, once renamed, of the finished file)."""
        try:
            return os.open(self.partial, os.O_RDONLY)
        except FileNotFoundError:
            return os.open(self.final, os.O_RDONLY)

    async def chunks(self, fd: int, start: int, end: int):
        """Bytes ``[start, end)`` as they reach the disk; raises if the download fails first (the
        node sees a cut transfer, never a whole unverified file)."""
        sent = start
        try:
            while sent < end:
                if self.error is not None:
                    raise WeightTransferError(f"upstream transfer failed: {self.error}")
                # the last byte goes out once the file is verified (and counted): a node never
                # holds a whole file the cache has not checked
                ready = self.written if self.done else min(self.written, self.size - 1)
                if ready > sent:
                    n = min(ready, end) - sent
                    data = os.pread(fd, min(n, STREAM_CHUNK), sent)
                    if data:
                        sent += len(data)
                        yield data
                        continue
                if self.done:  # ended without the bytes this reader still needs
                    raise WeightTransferError("upstream transfer ended short")
                await self._changed.wait()
        finally:
            os.close(fd)


class _Pending:
    """A file being produced (rebuilt or downloaded); ``began`` is set once it streams."""

    def __init__(self) -> None:
        self.task: asyncio.Future | None = None
        self.transfer: _Transfer | None = None
        self.began = asyncio.Event()


class _Base:
    """The newest full state the cache holds for one policy (snapshots are rebuilt from it)."""

    def __init__(self, version: int, digest: str, state: dict[str, Any]):
        self.version, self.digest, self.state = version, digest, state


class WeightCache:
    """Content-addressed file cache in front of one or more weight servers."""

    #: Most deltas applied to rebuild one snapshot (they are read from the cache's disk, or
    #: downloaded once each); beyond that the snapshot is downloaded.
    max_rebuild_chain = 16

    def __init__(
        self,
        upstreams: dict[str, str],
        token: str,
        root: str | Path | None = None,
        *,
        keep_files: int = 32,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        retries: int = 4,
        dataflow: str | None = None,
        ca_file: str | None = None,
    ):
        """``dataflow``: the run's dataflow URL, whose version table says where each policy's
        weights are now (followed when an upstream fails); ``token`` is then a node token."""
        import httpx

        if not token:
            raise ValueError("a weight cache needs the run token")
        if not upstreams and not dataflow:
            raise ValueError("a weight cache needs a dataflow URL or at least one upstream")
        self.dataflow_url = dataflow
        self.ca_file = ca_file
        self._dataflow: Any = None
        self._follow_lock: asyncio.Lock | None = None
        self.upstreams = dict(upstreams)
        self.token = token
        self._own_root = root is None
        self.root = Path(root or tempfile.mkdtemp(prefix="astraflow-weight-cache-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep_files = max(2, keep_files)
        # A stalled upstream (a partitioned link) must not hold the cache: bounded timeouts, and
        # downloads in a pool of their own (asyncio's default pool is a few threads, which stuck
        # transfers once filled, freezing every request of the region).
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._retries = retries
        self._clients: dict[str, WeightClient] = {}
        self._meta_clients: dict[str, Any] = {}
        self._executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix="weight-cache")
        self._inflight: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._bases: dict[str, _Base] = {}
        self._base_lock = threading.Lock()
        self.stats = WeightCacheStats(upstreams=dict(self.upstreams))

    def close(self) -> None:
        for c in list(self._clients.values()):
            c.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        closers = [c.aclose() for c in self._meta_clients.values()]
        if self._dataflow is not None:
            closers.append(self._dataflow.close())
        for closer in closers:
            try:
                asyncio.run(closer)
            except Exception:  # noqa: BLE001 - closing at exit: nothing left to do on failure
                pass
        if self._own_root:
            import shutil

            shutil.rmtree(self.root, ignore_errors=True)

    # ----------------------------------------------------------------- upstream
    def upstream_for(self, policy: str) -> str:
        url = self.upstreams.get(policy) or self.upstreams.get("*")
        if url is None:
            raise HTTPException(
                status_code=404, detail=f"this weight cache has no upstream for policy {policy!r}"
            )
        return url

    async def upstream(self, policy: str) -> str:
        """The policy's upstream; asked of the dataflow when none is known yet."""
        if self.upstreams.get(policy) is None and self.upstreams.get("*") is None:
            await self.follow(policy, None)
        return self.upstream_for(policy)

    async def follow(self, policy: str, failed: str | None) -> bool:
        """Move ``policy`` to the location its newest version was announced at, when that is not
        ``failed`` (the upstream that just failed). True when the upstream changed."""
        if self.dataflow_url is None:
            return False
        if self._follow_lock is None:
            self._follow_lock = asyncio.Lock()
        async with self._follow_lock:
            current = self.upstreams.get(policy) or self.upstreams.get("*")
            if current is not None and current != failed:
                return True  # another request moved it meanwhile
            if self._dataflow is None:
                from astraflow.protocol.client import DataflowClient

                self._dataflow = DataflowClient(
                    self.dataflow_url, self.token, timeout=10.0, retries=1, ca_file=self.ca_file
                )
            try:
                table = await self._dataflow.latest_versions()
            except Exception as exc:  # the dataflow unreachable: keep the upstream we have
                log.warning("cannot read the version table at %s: %s", self.dataflow_url, exc)
                return False
            wv = table.versions.get(policy)
            if wv is None or not wv.location.startswith(("http://", "https://")):
                return False
            location = wv.location.rstrip("/")
            if location == current:
                return False
            log.info("policy %s: upstream %s -> %s (version table)", policy, current, location)
            self.upstreams[policy] = location
            self.stats.upstreams = dict(self.upstreams)
            self.stats.upstream_changes += 1
            return True

    def _client(self, url: str) -> WeightClient:
        with self._lock:
            client = self._clients.get(url)
            if client is None:
                client = self._clients[url] = WeightClient(
                    url, self.token, timeout=self._timeout, retries=self._retries,
                    ca_file=self.ca_file,
                )  # fmt: skip
            return client

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def relay_json(self, policy: str, path: str, retries: int = 1) -> Any:
        """GET ``path`` from the policy's upstream; 404 stays 404, anything else broken is 502
        (the node's client retries a 502; the cache does not hold a request for long). Either
        makes the cache consult the version table first: a moved upstream is asked again."""
        url = await self.upstream(policy)
        try:
            return await self._relay_json(url, path, retries)
        except HTTPException as exc:
            if exc.status_code in (404, 502) and await self.follow(policy, url):
                return await self._relay_json(self.upstream_for(policy), path, retries)
            raise

    async def _relay_json(self, url: str, path: str, retries: int) -> Any:
        import httpx

        client = self._meta_clients.get(url)
        if client is None:
            client = self._meta_clients[url] = httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {self.token}"},
                timeout=self._timeout,
            )  # fmt: skip
        self.stats.meta_requests += 1
        for attempt in range(retries + 1):
            try:
                resp = await client.get(path)
                break
            except httpx.TransportError as exc:
                if attempt == retries:
                    self.stats.upstream_errors += 1
                    raise HTTPException(status_code=502, detail=f"upstream: {exc!r}") from exc
                await asyncio.sleep(0.5)
        if resp.status_code == 404:
            raise HTTPException(status_code=404, detail=_detail(resp))
        if resp.status_code != 200:
            self.stats.upstream_errors += 1
            raise HTTPException(
                status_code=502, detail=f"upstream answered {resp.status_code}: {_detail(resp)}"
            )
        return resp.json()

    # ----------------------------------------------------------------- files
    async def _named(
        self, policy: str, version: int, kind: str, meta: dict[str, Any] | None
    ) -> tuple[str, Path, dict[str, Any]]:
        if meta is None:
            meta = await self.relay_json(policy, f"/weights/{policy}/{version}/meta")
        sha, size = meta.get(f"{kind}_sha256"), meta.get(f"{kind}_bytes")
        if not sha:
            raise HTTPException(
                status_code=404, detail=f"version {version} of {policy!r} has no {kind}"
            )
        named = _SHA_RE.match(sha) if isinstance(sha, str) else None
        if named is None or not isinstance(size, int) or size < 0:
            raise HTTPException(status_code=502, detail=f"upstream meta of v{version} is malformed")
        return sha, self.root / f"{named.group(1)}.bin", meta

    def _hit(self, path: Path) -> bool:
        if not path.is_file():
            return False
        self.stats.hits += 1
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return True

    def _pending(
        self, policy: str, version: int, kind: str, meta: dict[str, Any], sha: str, path: Path
    ) -> _Pending:
        pending = self._inflight.get(sha)
        if pending is None:
            # The transfer is a task of its own: a node giving up on its request (a timeout, a
            # disconnect) must not cancel a download that other nodes wait for, or start another.
            pending = self._inflight[sha] = _Pending()
            pending.task = asyncio.ensure_future(
                self._fetch(pending, policy, version, kind, meta, path)
            )
            pending.task.add_done_callback(lambda t, sha=sha: self._settled(sha, t))
        else:
            self.stats.coalesced += 1
        return pending

    @staticmethod
    async def _settle(task: asyncio.Future) -> None:
        try:
            await asyncio.shield(task)
        except WeightTransferError as exc:
            raise HTTPException(status_code=502, detail=f"upstream: {exc}") from exc

    async def file(
        self, policy: str, version: int, kind: str, meta: dict[str, Any] | None = None
    ) -> tuple[Path, dict[str, Any]]:
        """The verified local copy of ``kind`` ('full' or 'delta') of the version, and its meta."""
        sha, path, meta = await self._named(policy, version, kind, meta)
        if self._hit(path):
            return path, meta
        await self._settle(self._pending(policy, version, kind, meta, sha, path).task)
        return path, meta

    async def source(
        self, policy: str, version: int, kind: str
    ) -> tuple[Path | tuple[_Transfer, int], dict[str, Any]]:
        """What to send for a node's request: the verified local file, or, while the file
        downloads, the transfer and an open descriptor of its bytes so far."""
        sha, path, meta = await self._named(policy, version, kind, None)
        if self._hit(path):
            return path, meta
        pending = self._pending(policy, version, kind, meta, sha, path)
        began = asyncio.ensure_future(pending.began.wait())
        try:
            await asyncio.wait({pending.task, began}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            began.cancel()
        transfer = pending.transfer
        if transfer is not None and not pending.task.done():
            try:
                fd = transfer.open()
            except OSError:
                pass  # renamed and evicted in between: settle below
            else:
                self.stats.streamed += 1
                return (transfer, fd), meta
        await self._settle(pending.task)
        return path, meta

    def _cached(self, sha: str) -> bool:
        named = _SHA_RE.match(sha) if isinstance(sha, str) else None
        return named is not None and (self.root / f"{named.group(1)}.bin").is_file()

    def _settled(self, sha: str, task: asyncio.Future) -> None:
        self._inflight.pop(sha, None)
        if not task.cancelled() and isinstance(task.exception(), WeightTransferError):
            self.stats.upstream_errors += 1

    async def _fetch(
        self, pending: _Pending, policy: str, version: int, kind: str, meta: dict, path: Path
    ) -> None:
        if kind == "full" and await self._rebuild(policy, version, meta, path):
            return
        size, sha = meta[f"{kind}_bytes"], meta[f"{kind}_sha256"]
        transfer = _Transfer(path.with_name(f".{path.stem}.partial"), path, size)
        transfer.partial.touch()  # exists before any node opens it (one inode for every attempt)
        pending.transfer = transfer
        pending.began.set()
        error: str | None = "cancelled"
        try:
            url = await self.upstream(policy)
            try:
                await self._run(self._download, url, policy, version, kind, size, sha, transfer)
            except WeightTransferError:
                if not await self.follow(policy, url):
                    raise
                transfer.report(0)  # a new upstream sends the same bytes from the start
                url = self.upstream_for(policy)
                await self._run(self._download, url, policy, version, kind, size, sha, transfer)
            error = None
        except BaseException as exc:
            error = str(exc) or type(exc).__name__
            raise
        finally:
            transfer.finish(error)
            transfer.partial.unlink(missing_ok=True)  # renamed when verified; else dropped

    def _download(
        self, url: str, policy: str, version: int, kind: str, size: int, sha: str, tr: _Transfer
    ) -> None:
        """Download into ``tr.partial``, reporting each chunk to the streamed nodes; the file
        becomes the cache's copy only once verified."""
        written = 0
        with open(tr.partial, "r+b") as fh:
            fh.truncate()

            def sink(chunk: bytes | None) -> None:
                nonlocal written
                if chunk is None:  # the upstream ignored a resume: the same bytes again
                    fh.seek(0)
                    fh.truncate()
                    written = 0
                else:
                    fh.write(chunk)
                    written += len(chunk)
                fh.flush()
                tr.report(written)

            data = self._client(url).fetch_file(policy, version, kind, size, sha, sink)
        os.replace(tr.partial, tr.final)  # verified by fetch_file
        with self._lock:
            self.stats.files_fetched += 1
            self.stats.bytes_fetched += size
        log.info("fetched %s of %s v%d from upstream (%d bytes)", kind, policy, version, size)
        if kind == "full":
            self._adopt(policy, version, data)
        self._evict()

    def _store_file(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    # ----------------------------------------------------------------- rebuilt snapshots
    def _adopt(self, policy: str, version: int, data: bytes) -> None:
        """A downloaded snapshot newer than the base becomes the base."""
        from safetensors.torch import load

        from astraflow.weights.digest import state_digest

        with self._base_lock:
            base = self._bases.get(policy)
            if base is not None and base.version >= version:
                return
            state = load(data)
            self._bases[policy] = _Base(version, state_digest(state), state)

    async def _rebuild(self, policy: str, version: int, meta: dict[str, Any], path: Path) -> bool:
        """Write the snapshot of ``version`` from the base and the deltas after it; False when it
        cannot be done (no base, a gap, a chain too long, a mismatch): download it then."""
        base = self._bases.get(policy)
        if base is None or not 0 < version - base.version <= self.max_rebuild_chain:
            return False
        try:
            chain = []
            for v in range(base.version + 1, version + 1):
                m = meta if v == version else await self.relay_json(
                    policy, f"/weights/{policy}/{v}/meta"
                )  # fmt: skip
                if m.get("parent") != v - 1 or not m.get("delta_sha256"):
                    return False
                chain.append((v, m))
            # only worth it when the deltas still to download weigh less than the snapshot
            # (a large-step or fp32 delta is about as big as the snapshot itself)
            missing = sum(
                int(m["delta_bytes"]) for _, m in chain
                if not self._cached(m["delta_sha256"]) and m["delta_sha256"] not in self._inflight
            )  # fmt: skip
            if missing >= int(meta["full_bytes"]):
                return False
            for v, m in chain:
                delta_path, _ = await self.file(policy, v, "delta", m)
                if not await self._run(self._advance, policy, v, delta_path):
                    return False
            return await self._run(self._write_rebuilt, policy, version, meta, path)
        except HTTPException:
            return False

    def _advance(self, policy: str, version: int, delta_path: Path) -> bool:
        """Apply the delta of ``version`` to the base if the base is its parent."""
        from astraflow.weights.delta import DeltaError, SparseDelta

        with self._base_lock:
            base = self._bases.get(policy)
            if base is None:
                return False
            if base.version >= version:
                return True  # another request already carried the base past it
            if base.version != version - 1:
                return False
            try:
                delta = SparseDelta.from_bytes(delta_path.read_bytes())
                delta.apply_(base.state, parent_digest=base.digest)
            except (OSError, DeltaError) as exc:
                log.warning("cannot rebuild %s v%d from its delta (%s)", policy, version, exc)
                del self._bases[policy]  # possibly half applied: start again from a download
                return False
            base.version, base.digest = version, delta.digest
            return True

    def _write_rebuilt(self, policy: str, version: int, meta: dict[str, Any], path: Path) -> bool:
        with self._base_lock:
            base = self._bases.get(policy)
            if base is None or base.version != version or base.digest != meta.get("digest"):
                return False
            data = snapshot_bytes(base.state, base.digest, version)
        if len(data) != meta.get("full_bytes") or bytes_digest(data) != meta.get("full_sha256"):
            with self._lock:
                self.stats.rebuild_mismatches += 1
            log.warning("rebuilt snapshot of %s v%d differs from the trainer's", policy, version)
            return False
        self._store_file(path, data)
        with self._lock:
            self.stats.files_rebuilt += 1
        log.info("rebuilt the snapshot of %s v%d from deltas", policy, version)
        self._evict()
        return True

    def _evict(self, min_age_s: float = 60.0) -> None:
        """Keep the ``keep_files`` most recently used files; a file used in the last ``min_age_s``
        stays (a request may be about to send it; one already sending keeps its open file)."""
        import time

        with self._lock:
            stamped = []
            for f in self.root.glob("*.bin"):
                try:
                    stamped.append((f.stat().st_mtime, f))
                except OSError:
                    continue
            stamped.sort()
            now = time.time()
            for mtime, old in stamped[: max(0, len(stamped) - self.keep_files)]:
                if now - mtime > min_age_s:
                    old.unlink(missing_ok=True)

    def snapshot(self) -> WeightCacheStats:
        files = list(self.root.glob("*.bin"))
        self.stats.cached_files = len(files)
        self.stats.cached_bytes = sum(f.stat().st_size for f in files if f.exists())
        return self.stats.model_copy()


def _byte_range(header: str | None, size: int) -> tuple[int, int]:
    """``[start, end)`` of a single ``bytes=A-`` / ``bytes=A-B`` range; the whole file otherwise."""
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", (header or "").strip())
    if m is None:
        return 0, size
    start = int(m.group(1))
    end = min(int(m.group(2)) + 1, size) if m.group(2) else size
    return (start, end) if start < end else (0, size)


def _detail(resp) -> str:
    try:
        return str(resp.json().get("detail", resp.text))
    except ValueError:
        return resp.text[:200]


def create_cache_app(cache: WeightCache) -> FastAPI:
    """FastAPI app serving ``cache`` with the weight server's routes (see the module docstring)."""
    app = FastAPI(title="AstraFlow weight cache", docs_url=None, redoc_url=None)
    token = cache.token

    def require_token(request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), token.encode()):
            raise HTTPException(
                status_code=401,
                detail="missing or wrong bearer token (send 'Authorization: Bearer <run token>')",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def valid_policy(policy: str) -> str:
        try:
            return check_policy(policy)
        except WeightStoreError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True, "cache": True}

    @app.get("/cache/stats", dependencies=[Depends(require_token)])
    def stats() -> WeightCacheStats:
        return cache.snapshot()

    @app.get("/metrics", dependencies=[Depends(require_token)], include_in_schema=False)
    def prometheus_metrics() -> Response:
        families = list(weight_cache_families(cache.snapshot()))
        return Response(exposition(ServiceMetrics().registry, families), media_type=CONTENT_TYPE)

    @app.get("/weights/{policy}/latest", dependencies=[Depends(require_token)])
    async def latest(policy: str) -> dict:
        return await cache.relay_json(policy, f"/weights/{valid_policy(policy)}/latest")

    @app.get("/weights/{policy}/versions", dependencies=[Depends(require_token)])
    async def versions(policy: str) -> dict:
        return await cache.relay_json(policy, f"/weights/{valid_policy(policy)}/versions")

    @app.get("/weights/{policy}/{version}/meta", dependencies=[Depends(require_token)])
    async def meta(policy: str, version: int) -> dict:
        return await cache.relay_json(policy, f"/weights/{valid_policy(policy)}/{version}/meta")

    async def send(request: Request, policy: str, version: int, kind: str) -> Response:
        src, m = await cache.source(valid_policy(policy), version, kind)
        headers = {DIGEST_HEADER: m["digest"], SHA256_HEADER: m[f"{kind}_sha256"]}
        if kind == "delta":
            headers[PARENT_HEADER] = str(m.get("parent"))
        cache.stats.files_served += 1
        size = int(m[f"{kind}_bytes"])
        cache.stats.bytes_served += size
        if isinstance(src, Path):
            return WeightFileResponse(src, media_type="application/octet-stream", headers=headers)
        transfer, fd = src  # still downloading: stream what is on disk, then what arrives
        start, end = _byte_range(request.headers.get("range"), size)
        status = 200
        if (start, end) != (0, size):
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        headers["Content-Length"] = str(end - start)
        headers["Accept-Ranges"] = "bytes"
        return StreamingResponse(
            transfer.chunks(fd, start, end), status_code=status,
            media_type="application/octet-stream", headers=headers,
        )  # fmt: skip

    @app.get("/weights/{policy}/{version}/full", dependencies=[Depends(require_token)])
    async def full(request: Request, policy: str, version: int) -> Response:
        return await send(request, policy, version, "full")

    @app.get("/weights/{policy}/{version}/delta", dependencies=[Depends(require_token)])
    async def delta(request: Request, policy: str, version: int) -> Response:
        return await send(request, policy, version, "delta")

    return app
