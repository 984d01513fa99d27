"""Scale benchmark of one dataflow service: thousands of registered nodes (not a test).

One real ``astraflow serve dataflow`` child process (one torch thread, bound to 127.0.0.1, its
SQLite store) serves simulated rollout nodes: light asyncio clients spread over several
load-generator processes (``--workers``), each node with its own aiohttp session (the same msgpack
requests as :class:`astraflow.protocol.client.DataflowClient`, see ``dataflow_load.AiohttpNode``).
A node does what ``astraflow/rollout/node.py`` does on the wire:

* heartbeats every ``dataflow.heartbeat_interval_s`` (2 s, the recipe default), carrying its
  versions and the leases in flight;
* keeps one lease request parked (``POST /leases``, ``wait_s`` = the node's ``lease_wait_s``,
  10 s); on a grant it "runs" the group for ``--episode-s`` (mean, exponential) and pushes a small
  trajectory per episode (``POST /trajectories``); on news of a version it takes it at once;
* churn: ``--churn`` nodes a second (over the whole pool) finish what they hold, hang up their
  parked request, deregister, and a new node registers in their place.

A simulated trainer pulls batches (long poll), takes ``--step-s`` per optimizer step, acks and
announces a new version every step, so the run progresses and every announcement reaches the
parked requests. Backpressure (``admission = "buffer"``) holds the groups in flight and buffered
to ``buffer_steps`` steps, room for the trainer's pace (``episode_s / step_s`` steps) plus two,
so every node beyond that sits parked, as in a pool sized above the trainer's pace.

Measured per node count (``nodes_N.*`` in the JSON):

* ``lease_wakeup_p50_ms``/``p99_ms``: from the moment the trainer sends the batch request that
  frees backpressure room (the batch was already buffered: it comes back at once; an upper bound,
  as ``lease_wakeup.py``'s), or receives the reply of one it waited for (the room freed as it
  was formed), to the moment a request parked before then receives its lease (the machine's
  monotonic clock, shared by every process);
* ``heartbeat_p50_ms``/``p99_ms``, ``push_p99_ms``, ``pushes_per_s``, ``heartbeats_per_s``;
* ``rss_mb`` (service, at the end), ``service_cpu``; ``status_bytes`` and ``status_ms`` (JSON
  ``GET /status``, as the dashboard reads it).

A separate long run (``store_*``): few busy nodes with churn and a trainer that keeps up, for
``--store-steps`` optimizer steps (10,000 in the full run), measures the store's bytes per
trained sample (the marginal growth over the second half of the run) and each table's share at
the end, read from the store file through ``storage.history.table_sizes``.

Measured before the changes it drove: at 4,096 nodes a ``/status`` with every node was a megabyte
built on the writer thread; fixed 2 s heartbeats were 2,048 write transactions a second; heartbeat
p50 300 ms and p99 0.9-1.8 s behind dispatch passes that took half the writer; and the WAL reached
520 MB within three minutes of the long run before the writer's TRUNCATE checkpoint.

    python bench/dataflow_scale.py --quick --json /tmp/scale.json
    flock /tmp/astraflow-bench.lock python bench/dataflow_scale.py --json out.json
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _stamp
import httpx
import msgpack
import psutil
from _cli import add_output_flags, bench_parser
from _report import console, table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dataflow_load import TOKEN, AiohttpNode, ServiceProcess, packed_trajectory, pct  # noqa: E402

from astraflow.dataflow.storage import history  # noqa: E402
from astraflow.dataflow.storage.store import read_only  # noqa: E402
from astraflow.protocol import (  # noqa: E402
    Heartbeat,
    HeartbeatReply,
    LeaseGrant,
    LeaseRequest,
    NodeRegistered,
    NodeRegistration,
    PushResult,
    new_id,
)
from astraflow.protocol.client import DataflowClient  # noqa: E402
from astraflow.protocol.codec import encode  # noqa: E402
from astraflow.recipe import Recipe, recipe_to_toml  # noqa: E402

POLICY = "policy"
#: the node's default ``rollout.lease_wait_s`` (astraflow/rollout/node.py)
LEASE_WAIT_S = 10.0
#: a batch request answered within this was buffered already (not a long poll that waited)
READY_S = 0.05


def write_recipe(
    workdir: Path,
    *,
    nodes: int,
    group_size: int,
    groups_per_step: int,
    buffer_steps: int,
    heartbeat_s: float,
) -> Path:
    recipe = Recipe.model_validate(
        {
            "run": {"name": "scale", "output_dir": str(workdir / "runs"), "max_steps": 10**7},
            "policies": {
                POLICY: {
                    "model": "builtin:tiny-arith",
                    "trainer": {"groups_per_step": groups_per_step},
                }
            },
            "tasks": {"group_size": group_size},
            "dataflow": {
                "admission": "buffer",
                "buffer_steps": buffer_steps,
                "max_lag": 10**6,
                "heartbeat_interval_s": heartbeat_s,
                "max_nodes": max(1024, 2 * nodes),
            },
        }
    )
    path = workdir / "recipe.toml"
    path.write_text(recipe_to_toml(recipe))
    return path


def trajectory(rng: random.Random) -> dict:
    """A small trajectory (16 prompt + 16 generated tokens), packed as on the wire."""
    return packed_trajectory([rng.randrange(100, 200) for _ in range(32)], prompt=16)


def group_push(node_id: str, lease, group_size: int, rng: random.Random) -> bytes:
    """One push with the whole group (as a node pushes a finished group): mixed rewards, so no
    filter drops it."""
    rewards = [float(i % 2) for i in range(group_size)]
    return msgpack.packb(
        {
            "idempotency_key": new_id("push"),
            "node_id": node_id,
            "lease_id": lease.id,
            "episodes": [
                {
                    "id": new_id("ep"),
                    "task_id": lease.task.id,
                    "trajectories": [trajectory(rng)],
                    "rewards": {"agent": r},
                    "finish_reason": "terminated",
                }
                for r in rewards
            ],
        },
        use_bin_type=True,
    )


@dataclass
class LoadSpec:
    """What one load-generator process simulates; sent to every worker."""

    url: str
    first: int
    count: int
    group_size: int
    heartbeat_s: float
    episode_s: float
    #: joins/leaves per second made by this worker
    churn_per_s: float
    seed: int = 0


@dataclass
class Log:
    """What a worker measured, as (monotonic end time, latency) pairs and counts."""

    heartbeats: list = field(default_factory=list)
    pushes: list = field(default_factory=list)
    #: (request sent, reply received, leases granted) of every lease request
    leases: list = field(default_factory=list)
    joins: int = 0
    leaves: int = 0
    errors: list = field(default_factory=list)
    #: (monotonic time, seconds late) of the worker's event-loop probe: how long a ready
    #: callback waited for this load generator's loop (client-side delay in every latency)
    lag: list = field(default_factory=list)


class SimNode:
    """One simulated node: registration, heartbeat loop, lease loop (see the module docstring)."""

    def __init__(self, spec: LoadSpec, index: int, log: Log) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed * 1_000_003 + index)
        self.log = log
        self.http = AiohttpNode(spec.url)
        self.node_id = ""
        self.interval = spec.heartbeat_s
        self.version = 0
        self.in_flight: list[str] = []
        self.leaving = False
        self.tasks: list[asyncio.Task] = []

    async def join(self, name: str) -> None:
        reg = NodeRegistration(policies={POLICY: self.version}, name=name)
        reply = await self.http.call("/nodes/register", encode(reg), NodeRegistered)
        self.node_id, self.interval = reply.node_id, reply.heartbeat_interval_s

    def start(self) -> None:
        self.tasks = [asyncio.create_task(self._heartbeats()), asyncio.create_task(self._work())]

    async def _heartbeats(self) -> None:
        await asyncio.sleep(self.rng.random() * self.interval)  # nodes start apart
        path = f"/nodes/{self.node_id}/heartbeat"
        while True:
            hb = Heartbeat(versions={POLICY: self.version}, in_flight=list(self.in_flight))
            t0 = time.monotonic()
            try:
                reply = await self.http.call(path, encode(hb), HeartbeatReply)
            except Exception as exc:  # noqa: BLE001 - counted, the node goes on as a real one
                self.log.errors.append(f"heartbeat: {exc}"[:200])
            else:
                t1 = time.monotonic()
                self.log.heartbeats.append((t1, t1 - t0))
                self.version = max(self.version, reply.latest_versions.get(POLICY, 0))
                # as the node does: the interval the service asks for now
                self.interval = reply.heartbeat_interval_s or self.interval
            await asyncio.sleep(self.interval)

    async def _work(self) -> None:
        while not self.leaving:
            req = LeaseRequest(
                node_id=self.node_id,
                max_tasks=1,
                versions={POLICY: self.version},
                wait_s=LEASE_WAIT_S,
                idempotency_key=new_id("lease-req"),
            )
            t0 = time.monotonic()
            try:
                grant = await self.http.call("/leases", encode(req), LeaseGrant)
            except Exception as exc:  # noqa: BLE001
                self.log.errors.append(f"lease: {exc}"[:200])
                await asyncio.sleep(1.0)
                continue
            t1 = time.monotonic()
            self.log.leases.append((t0, t1, len(grant.leases)))
            self.version = max(self.version, grant.latest_versions.get(POLICY, 0))
            for lease in grant.leases:
                self.in_flight.append(lease.id)
                await asyncio.sleep(self.rng.expovariate(1.0 / self.spec.episode_s))
                body = group_push(self.node_id, lease, self.spec.group_size, self.rng)
                t0 = time.monotonic()
                try:
                    res = await self.http.call("/trajectories", body, PushResult)
                    if not res.accepted:
                        self.log.errors.append(f"push refused: {res.detail}"[:200])
                except Exception as exc:  # noqa: BLE001
                    self.log.errors.append(f"push: {exc}"[:200])
                t1 = time.monotonic()
                self.log.pushes.append((t1, t1 - t0))
                self.in_flight.remove(lease.id)

    async def leave(self) -> None:
        """Drain and go: finish the group in hand, hang up the parked request, deregister."""
        self.leaving = True
        work = self.tasks[1]
        while self.in_flight and not work.done():
            await asyncio.sleep(0.05)
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        try:
            async with self.http.session.delete(f"/nodes/{self.node_id}") as resp:
                await resp.read()
        except Exception as exc:  # noqa: BLE001
            self.log.errors.append(f"deregister: {exc}"[:200])
        await self.http.close()


def load_worker(spec: LoadSpec, ready, stop, results) -> None:
    import resource

    import uvloop

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvloop.run(_worker(spec, ready, stop, results))


async def _worker(spec: LoadSpec, ready, stop, results) -> None:
    log = Log()
    loop = asyncio.get_running_loop()
    nodes = [SimNode(spec, spec.first + i, log) for i in range(spec.count)]
    gate = asyncio.Semaphore(32)  # registrations in flight: a cluster's nodes start over minutes

    async def join(node: SimNode, name: str) -> None:
        async with gate:
            await node.join(name)

    await asyncio.gather(*(join(n, f"sim-{spec.first + i}") for i, n in enumerate(nodes)))
    for n in nodes:
        n.start()
    probe = asyncio.create_task(_lag_probe(log))
    ready.put(os.getpid())
    done = asyncio.Event()
    loop.run_in_executor(None, lambda: (stop.wait(), loop.call_soon_threadsafe(done.set)))
    rng = random.Random(spec.seed)
    joined = spec.count
    leaving: set[asyncio.Task] = set()

    async def replace(i: int) -> None:
        nonlocal joined
        old = nodes[i]
        await old.leave()
        log.leaves += 1
        new = SimNode(spec, spec.first + spec.count + joined, log)
        joined += 1
        try:
            await new.join(f"sim-{spec.first}-{joined}")
        except Exception as exc:  # noqa: BLE001
            log.errors.append(f"register: {exc}"[:200])
            return
        new.start()
        nodes[i] = new
        log.joins += 1

    while not done.is_set():
        if spec.churn_per_s <= 0:
            await done.wait()
            break
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), rng.expovariate(spec.churn_per_s))
        if done.is_set():
            break
        task = asyncio.create_task(replace(rng.randrange(len(nodes))))
        leaving.add(task)
        task.add_done_callback(leaving.discard)
    probe.cancel()
    for t in list(leaving):
        t.cancel()
    for n in nodes:
        for t in n.tasks:
            t.cancel()
    await asyncio.gather(*(t for n in nodes for t in n.tasks), return_exceptions=True)
    await asyncio.gather(*(n.http.close() for n in nodes), return_exceptions=True)
    results.put(
        {
            "heartbeats": log.heartbeats,
            "pushes": log.pushes,
            "leases": log.leases,
            "joins": log.joins,
            "leaves": log.leaves,
            "lag": log.lag,
            "errors": log.errors[:20],
            "n_errors": len(log.errors),
        }
    )


async def _lag_probe(log: Log, every_s: float = 0.05) -> None:
    """Sleep ``every_s`` again and again and record how late each wake-up was: the scheduling
    delay that this load generator's own event loop adds to every latency it measures."""
    while True:
        t0 = time.monotonic()
        await asyncio.sleep(every_s)
        t1 = time.monotonic()
        log.lag.append((t1, t1 - t0 - every_s))


async def trainer(
    client: DataflowClient,
    num_groups: int,
    step_s: float,
    stop: asyncio.Event,
    events: list,
    max_steps: int | None = None,
) -> int:
    """A trainer: pull a batch (long poll), an optimizer step of ``step_s``, ack, announce the
    new version. ``events``: (request sent, reply received, samples) of every batch served."""
    version = 0
    while not stop.is_set() and (max_steps is None or version < max_steps):
        t0 = time.monotonic()
        reply = await client.next_batch(
            policy=POLICY, num_groups=num_groups, trainer_version=version, wait_s=1.0
        )
        if reply.batch is None:
            continue
        events.append((t0, time.monotonic(), sum(len(g.samples) for g in reply.batch.groups)))
        if step_s:
            await asyncio.sleep(step_s)
        version += 1
        await client.ack(reply.batch.id, trainer_version=version)
        await client.announce_version(
            policy=POLICY, version=version, location="http://127.0.0.1:1/w", digest=f"d{version}"
        )
    return version


def wakeups(leases: list, events: list) -> list[float]:
    """Lease wake-up latencies: each grant to a request parked before a batch event, measured
    from the latest such event sent before the grant arrived (see the module docstring)."""
    # a batch that was buffered comes back at once: room freed after the request was sent; one
    # the trainer waited for freed room as it was formed, just before its reply arrived
    sends = sorted(t0 if t1 - t0 < READY_S else t1 for t0, t1, _ in events)
    out = []
    import bisect

    for sent, got, n in leases:
        if not n:
            continue
        i = bisect.bisect_right(sends, got) - 1
        if i < 0 or sends[i] < sent:
            continue  # not parked when room freed (asked after the event)
        out.append(got - sends[i])
    return out


async def status_probe(url: str) -> tuple[int, float]:
    """Bytes and seconds of one JSON ``GET /status`` (what the dashboard and scripts read)."""
    async with httpx.AsyncClient(
        base_url=url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as http:
        t0 = time.monotonic()
        resp = await http.get("/status")
        resp.raise_for_status()
        return len(resp.content), time.monotonic() - t0


def _delta(after: dict, before: dict, *keys: str) -> float:
    return sum(after.get(k, 0) - before.get(k, 0) for k in keys)


def _in(window: tuple[float, float], records: list) -> list:
    return [r for r in records if window[0] <= r[0] < window[1]]


async def scale_phase(args, nodes: int, duration: float, service: ServiceProcess) -> dict:
    """``nodes`` simulated nodes against ``service`` for ``duration`` measured seconds."""
    ctx = mp.get_context("spawn")
    ready, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    workers = max(1, min(args.workers, nodes))
    shares = [nodes // workers + (1 if w < nodes % workers else 0) for w in range(workers)]
    procs = [
        ctx.Process(
            target=load_worker,
            args=(
                LoadSpec(
                    url=service.url,
                    first=sum(shares[:w]),
                    count=shares[w],
                    group_size=args.group_size,
                    heartbeat_s=args.heartbeat_s,
                    episode_s=args.episode_s,
                    churn_per_s=args.churn / workers,
                    seed=w,
                ),
                ready,
                stop,
                results,
            ),
        )
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    client = DataflowClient(service.url, TOKEN, timeout=120, retries=3, max_connections=4)
    events: list = []
    trainer_stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        t_reg = time.monotonic()
        gens = [
            psutil.Process(await loop.run_in_executor(None, ready.get, True, 900)) for _ in procs
        ]
        registered_s = time.monotonic() - t_reg
        train = asyncio.create_task(
            trainer(client, args.groups_per_step, args.step_s, trainer_stop, events)
        )
        await asyncio.sleep(args.warmup)
        store0 = (await client.status()).store
        spy = (
            service.start_profile(Path(f"{args.profile}.{nodes}"), duration)
            if args.profile
            else None
        )
        cpu0, t0 = service.cpu_s(), time.monotonic()
        gen0 = sum(sum(g.cpu_times()[:2]) for g in gens)
        load0 = psutil.cpu_times()
        probes = []
        rss = 0.0
        while time.monotonic() - t0 < duration:
            probes.append(await status_probe(service.url))
            rss = max(rss, service.ps.memory_info().rss / 2**20)
            await asyncio.sleep(min(5.0, max(0.0, duration - (time.monotonic() - t0))))
        t1, cpu1 = time.monotonic(), service.cpu_s()
        gen1 = sum(sum(g.cpu_times()[:2]) for g in gens)
        load1 = psutil.cpu_times()
        rss = max(rss, service.ps.memory_info().rss / 2**20)
        doc = await client.status()
        if spy is not None:
            await loop.run_in_executor(None, spy.wait)
        stop.set()
        outs = [await loop.run_in_executor(None, results.get, True, 300) for _ in procs]
        trainer_stop.set()
        await asyncio.wait_for(train, timeout=60)
    finally:
        stop.set()
        trainer_stop.set()
        await client.close()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    window, elapsed = (t0, t1), t1 - t0
    hb = [lat for o in outs for _, lat in _in(window, o["heartbeats"])]
    pushes = [lat for o in outs for _, lat in _in(window, o["pushes"])]
    leases = [r for o in outs for r in o["leases"] if t0 <= r[1] < t1]
    wake = wakeups(leases, [e for e in events if t0 <= e[0] < t1])
    served = _in(window, events)
    errors = [e for o in outs for e in o["errors"]]
    lag = [late for o in outs for _, late in _in(window, o["lag"])]
    return {
        "nodes": nodes,
        "registered_nodes": doc.node_summary.active + doc.node_summary.silent,
        "register_s": registered_s,
        "seconds": elapsed,
        "pushes_per_s": len(pushes) / elapsed,
        "push_p99_ms": pct(pushes, 0.99) * 1000,
        "heartbeats_per_s": len(hb) / elapsed,
        # the interval the service asked of each node (dataflow.max_heartbeats_per_s)
        "heartbeat_interval_s": nodes / max(len(hb) / elapsed, 1e-9),
        "heartbeat_p50_ms": pct(hb, 0.50) * 1000,
        "heartbeat_p99_ms": pct(hb, 0.99) * 1000,
        "lease_requests_per_s": len(leases) / elapsed,
        "lease_wakeups": len(wake),
        "lease_wakeup_p50_ms": pct(wake, 0.50) * 1000,
        "lease_wakeup_p99_ms": pct(wake, 0.99) * 1000,
        # how late the load generators' own event loops ran a ready callback (a 50 ms sleep's
        # overshoot): the client-side share of the latencies above
        "client_lag_p50_ms": pct(lag, 0.50) * 1000,
        "client_lag_p99_ms": pct(lag, 0.99) * 1000,
        "steps_per_s": len(served) / elapsed,
        "samples_per_s": sum(e[2] for e in served) / elapsed,
        "joins": sum(o["joins"] for o in outs),
        "leaves": sum(o["leaves"] for o in outs),
        "rss_mb": rss,
        "service_cpu": (cpu1 - cpu0) / elapsed,
        # the load generators' CPU (cores), and the machine's busy cores in all (other
        # processes included: the machine is shared)
        "client_cpu": (gen1 - gen0) / elapsed,
        "machine_busy_cores": (
            sum(load1) - load1.idle - load1.iowait - (sum(load0) - load0.idle - load0.iowait)
        )
        / elapsed,
        "service_cpu_ms_per_request": 1000
        * (cpu1 - cpu0)
        / max(1, len(hb) + len(pushes) + len(leases)),
        "status_bytes": max(b for b, _ in probes),
        "status_ms": pct([s for _, s in probes], 0.50) * 1000,
        "status_max_ms": max(s for _, s in probes) * 1000,
        # the store's one writer: share of the window running operations and committing, and
        # the mean wait for the WAL's fsync that every reply waits for
        "writer_busy": _delta(doc.store, store0, "op_seconds", "commit_seconds") / elapsed,
        "ops_per_commit": _delta(doc.store, store0, "ops")
        / max(1, _delta(doc.store, store0, "commits")),
        "fsync_ms": 1000
        * _delta(doc.store, store0, "flush_seconds")
        / max(1, _delta(doc.store, store0, "flushes")),
        "errors": sum(o["n_errors"] for o in outs),
        "error_examples": errors[:5],
    }


async def store_phase(args, steps: int, service: ServiceProcess, store: Path) -> dict:
    """Busy nodes with churn and a trainer that keeps up, for ``steps`` optimizer steps; the
    store's size at each tenth of the run against the samples trained by then."""
    ctx = mp.get_context("spawn")
    ready, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    spec = LoadSpec(
        url=service.url,
        first=0,
        count=args.store_nodes,
        group_size=args.group_size,
        heartbeat_s=args.heartbeat_s,
        episode_s=0.001,
        churn_per_s=args.store_churn,
        seed=99,
    )
    proc = ctx.Process(target=load_worker, args=(spec, ready, stop, results))
    proc.start()
    client = DataflowClient(service.url, TOKEN, timeout=120, retries=3, max_connections=4)
    loop = asyncio.get_running_loop()
    events: list = []
    sizes: list[tuple[int, int]] = []
    trainer_stop = asyncio.Event()

    def store_bytes() -> int:
        # the WAL is checkpointed into the file every half second and keeps its size after
        return store.stat().st_size

    try:
        await loop.run_in_executor(None, ready.get, True, 300)
        t0 = time.monotonic()
        train = asyncio.create_task(
            trainer(client, args.store_groups_per_step, 0.0, trainer_stop, events, max_steps=steps)
        )
        while not train.done():
            await asyncio.wait({train}, timeout=1.0)
            sizes.append((sum(e[2] for e in events), store_bytes()))
        elapsed = time.monotonic() - t0
        trained = train.result()
        stop.set()
        out = await loop.run_in_executor(None, results.get, True, 300)
    finally:
        stop.set()
        trainer_stop.set()
        await client.close()
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    return {
        "steps": trained,
        "seconds": elapsed,
        "sizes": sizes,
        "joins": out["joins"],
        "leaves": out["leaves"],
        "errors": out["n_errors"],
    }


def store_summary(phase: dict, store: Path) -> dict:
    """Bytes per trained sample over the run's second half, and the tables at the end."""
    sizes = phase["sizes"]
    samples, final = sizes[-1]
    half = next((s for s in sizes if s[0] >= samples / 2), sizes[0])
    with read_only(store) as tx:
        tables = history.table_sizes(tx)
    total = sum(t.bytes for t in tables.values()) or 1
    return {
        "store_steps": phase["steps"],
        "store_seconds": phase["seconds"],
        "store_samples": samples,
        "store_bytes": final,
        "store_bytes_per_sample": (final - half[1]) / max(samples - half[0], 1),
        "store_node_joins": phase["joins"],
        "store_tables": {
            name: {"rows": t.rows, "bytes": t.bytes, "share": t.bytes / total}
            for name, t in sorted(tables.items(), key=lambda kv: -kv[1].bytes)
        },
        "store_errors": phase["errors"],
    }


def start_service(workdir: Path, recipe: Path) -> ServiceProcess:
    # one torch thread, as the launcher gives the service; bound to 127.0.0.1 by default
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    return ServiceProcess(workdir, recipe, "FULL")


def main() -> int:
    ap = bench_parser(__doc__)
    add_output_flags(ap, quick="256 and 1,024 nodes, short phases, 500 steps (< 3 min)", plot=False)
    ap.add_argument("--nodes", type=int, nargs="*", default=None, help="default 256 1024 4096")
    ap.add_argument("--duration", type=float, default=None, help="measured seconds per phase")
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--workers", type=int, default=4, help="load-generator processes")
    ap.add_argument("--heartbeat-s", type=float, default=2.0)
    ap.add_argument("--episode-s", type=float, default=20.0, help="mean simulated group time")
    ap.add_argument("--churn", type=float, default=2.0, help="node joins (and leaves) per second")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=16)
    ap.add_argument("--step-s", type=float, default=2.0, help="simulated optimizer step")
    ap.add_argument("--store-steps", type=int, default=None, help="long run (default 10,000)")
    ap.add_argument("--store-nodes", type=int, default=64)
    ap.add_argument("--store-groups-per-step", type=int, default=4)
    ap.add_argument("--store-churn", type=float, default=2.0)
    ap.add_argument(
        "--profile",
        default=None,
        help="profile the service with py-spy (raw stacks, every thread) to PATH.NODES per phase",
    )
    args = ap.parse_args()
    node_counts = args.nodes or ([256, 1024] if args.quick else [256, 1024, 4096])
    duration = args.duration or (20.0 if args.quick else 60.0)
    args.warmup = args.warmup if args.warmup is not None else (5.0 if args.quick else 15.0)
    store_steps = args.store_steps or (500 if args.quick else 10_000)
    out: dict = {"config": {k: v for k, v in vars(args).items() if k != "json"}}
    rows = []
    for n in node_counts:
        # room for the groups in flight at the trainer's pace, plus two steps buffered: the
        # trainer sets the pace and every node beyond that room waits parked
        buffer_steps = -(-int(args.episode_s) // int(max(args.step_s, 1))) + 2
        with tempfile.TemporaryDirectory(prefix="df-scale-") as tmp:
            workdir = Path(tmp)
            recipe = write_recipe(
                workdir,
                nodes=n,
                group_size=args.group_size,
                groups_per_step=args.groups_per_step,
                buffer_steps=buffer_steps,
                heartbeat_s=args.heartbeat_s,
            )
            service = start_service(workdir, recipe)
            console.print(
                f"[bold]{n} nodes[/] in {args.workers} load processes, {duration:.0f}s measured "
                f"(+{args.warmup:.0f}s), buffer_steps {buffer_steps}, against {service.url}"
            )
            try:
                r = asyncio.run(scale_phase(args, n, duration, service))
            finally:
                service.stop()
        out[f"nodes_{n}"] = r
        rows.append(r)
        console.print({k: v for k, v in r.items() if k != "error_examples"})
        for e in r["error_examples"]:
            console.print(f"[yellow]  {e}[/]")
    cols = [
        ("nodes", "nodes", "{:d}"),
        ("pushes/s", "pushes_per_s", "{:.0f}"),
        ("heartbeats/s", "heartbeats_per_s", "{:.0f}"),
        ("wake-up p50 ms", "lease_wakeup_p50_ms", "{:.1f}"),
        ("wake-up p99 ms", "lease_wakeup_p99_ms", "{:.1f}"),
        ("heartbeat p99 ms", "heartbeat_p99_ms", "{:.1f}"),
        ("push p99 ms", "push_p99_ms", "{:.1f}"),
        ("status KB", "status_bytes", "{:.0f}"),
        ("status ms", "status_ms", "{:.0f}"),
        ("RSS MB", "rss_mb", "{:.0f}"),
        ("svc CPU", "service_cpu", "{:.0%}"),
        ("writer busy", "writer_busy", "{:.0%}"),
        ("fsync ms", "fsync_ms", "{:.1f}"),
        ("errors", "errors", "{:d}"),
    ]
    body = [
        [fmt.format(r[key] / 1024 if key == "status_bytes" else r[key]) for _, key, fmt in cols]
        for r in rows
    ]
    console.print(
        table(
            f"one dataflow service, N nodes (heartbeat {args.heartbeat_s:g}s, churn "
            f"{args.churn:g}/s, {os.cpu_count()} CPUs)",
            [c[0] for c in cols],
            body,
        )
    )
    with tempfile.TemporaryDirectory(prefix="df-scale-store-") as tmp:
        workdir = Path(tmp)
        recipe = write_recipe(
            workdir,
            nodes=args.store_nodes,
            group_size=args.group_size,
            groups_per_step=args.store_groups_per_step,
            buffer_steps=4,
            heartbeat_s=args.heartbeat_s,
        )
        service = start_service(workdir, recipe)
        console.print(
            f"[bold]store[/]: {store_steps} steps, {args.store_nodes} busy nodes, churn "
            f"{args.store_churn:g}/s"
        )
        try:
            phase = asyncio.run(store_phase(args, store_steps, service, workdir / "df.db"))
        finally:
            service.stop()
        out.update(store_summary(phase, workdir / "df.db"))
    console.print(
        table(
            f"store after {out['store_steps']} steps ({out['store_samples']} samples, "
            f"{out['store_bytes'] / 2**20:.1f} MiB, "
            f"{out['store_bytes_per_sample']:.0f} B per trained sample)",
            ["table", "rows", "KiB", "share"],
            [
                [name, str(t["rows"]), f"{t['bytes'] / 1024:.0f}", f"{t['share']:.0%}"]
                for name, t in out["store_tables"].items()
            ],
        )
    )
    if args.json:
        _stamp.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
