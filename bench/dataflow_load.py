"""Load benchmark of the dataflow service (not a test).

Many concurrent simulated rollout nodes (64 and 256 clients) lease tasks (long-polling, as real
nodes do) and push realistic episodes (1-4k tokens, one episode per push, packed msgpack arrays)
while a trainer that keeps up pulls each batch as soon as it is ready and acknowledges it. The
service runs as a real ``astraflow serve dataflow`` child process with its SQLite store; the
simulated nodes run in load-generator processes of their own (``--workers``), each node with its
own HTTP client over loopback (aiohttp by default, the same msgpack requests as
:class:`astraflow.protocol.client.DataflowClient`; ``--client httpx`` uses that client itself), so
the bench measures the service rather than a load generator sharing its core with hundreds of
clients.

Phases: closed loop (every node pushes as fast as it is answered) measures capacity; a paced phase
(256 nodes together offering ``--rate`` pushes/s, default 1,100, above the 1,000/s target)
measures latency at that load. The JSON's top-level ``pushes_per_s``/``p50_ms``/``p99_ms`` are the
paced phase with the most clients (in closed loop, latency is clients / throughput by Little's
law, so it says nothing about the service); ``max_pushes_per_s`` is the best closed-loop phase.

Reports per phase: episode pushes/s, push latency p50/p99, lease latency p50/p99, batches/s,
service CPU seconds per 1k pushes (and pushes per service CPU-second: the least noisy figure on a
shared machine), SQLite commits per second (group commit at work).

Measured while building it (py-spy and a per-operation timer on the writer, 256 clients). With nodes
in the bench's own process polling with ``wait_s=0`` and a trainer sleeping 0.5 s a step, the
service spent 51 % of its samples in asyncio plumbing, 24 % parsing HTTP, 3 % in pushes (7.2 ms CPU
a push) and throughput was the trainer's ~128 pushes/s; httpx cost about three times aiohttp's CPU a
request. Writing samples with their group id from insertion cut a group's completion from ~88 to ~34
us a push; per operation on the writer (wall ms) lease 0.52 -> 0.33, lease pass 6.4 -> 4.4, batch
5.7 -> 3.6, push 0.27 (0.15 ms of it thread CPU: the rest is taking the GIL back). Group commit:
11-28 operations per commit; a longer WAL checkpoint interval and run-length-coded masks (twice
zlib's ~8 us an array) were tried and dropped.

    python bench/dataflow_load.py --quick --json out.json
    python bench/dataflow_load.py --clients 64 256 --duration 30 --synchronous NORMAL
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _stamp
import msgpack
import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

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
from astraflow.protocol.codec import MSGPACK, decode, encode  # noqa: E402
from astraflow.recipe import Recipe, recipe_to_toml  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 160)
TOKEN = "bench-token"


def write_recipe(
    workdir: Path, group_size: int, groups_per_step: int, buffer_steps: int | None = None
) -> Path:
    # admission by buffer_steps alone: the simulated trainer's pace is not what is measured here
    dataflow: dict = {"lease_timeout_s": 120.0, "max_lag": 10**6, "admission": "buffer"}
    if buffer_steps is not None:
        dataflow["buffer_steps"] = buffer_steps
    recipe = Recipe.model_validate(
        {
            "run": {"name": "bench", "output_dir": str(workdir / "runs"), "max_steps": 10**6},
            "policies": {
                "policy": {
                    "model": "builtin:tiny-arith",
                    "trainer": {"groups_per_step": groups_per_step},
                }
            },
            "tasks": {"group_size": group_size},
            "dataflow": dataflow,
        }
    )
    path = workdir / "recipe.toml"
    path.write_text(recipe_to_toml(recipe))
    return path


class ServiceProcess:
    def __init__(self, workdir: Path, recipe: Path, synchronous: str):
        self.workdir = workdir
        port_file = workdir / "port"
        cmd = [
            sys.executable,
            "-m",
            "astraflow.cli.main",
            "serve",
            "dataflow",
            "--recipe",
            str(recipe),
            "--store",
            str(workdir / "df.db"),
            "--port-file",
            str(port_file),
            "--synchronous",
            synchronous,
        ]
        env = {**os.environ, "ASTRAFLOW_TOKEN": TOKEN}
        self.log = open(workdir / "service.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.time() + 120
        while not port_file.exists():
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError((workdir / "service.log").read_text()[-3000:])
            time.sleep(0.05)
        self.url = port_file.read_text().strip()
        self.ps = psutil.Process(self.proc.pid)

    def start_profile(self, path: Path, seconds: float) -> subprocess.Popen | None:
        """Sample the service's busy threads with py-spy (SQLite time included: it releases the GIL)."""
        if shutil.which("py-spy") is None:
            console.print("[yellow]py-spy not installed (pip install py-spy); no profile[/]")
            return None
        return subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(self.proc.pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                "250",
                "--threads",
                "--nonblocking",
                "--format",
                "raw",
                "-o",
                str(path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def packed_trajectory(tokens: list[int], prompt: int) -> dict:
    """One single-turn trajectory of ``tokens`` whose first ``prompt`` are the prompt, its arrays
    packed as on the wire (generated tokens at log-prob -0.7 and version 0)."""
    mask = np.asarray([0] * prompt + [1] * (len(tokens) - prompt), dtype="<i4")
    return {
        "role": "agent",
        "tokens": np.asarray(tokens, dtype="<i4").tobytes(),
        "loss_mask": mask.tobytes(),
        "logprobs": np.where(mask == 1, -0.7, 0.0).astype("<f4").tobytes(),
        "versions": np.where(mask == 1, 0, -1).astype("<i4").tobytes(),
        "num_turns": 1,
    }


def episode_templates(count: int, seed: int = 0) -> list[dict]:
    """Trajectories of 1-4k tokens (256-token prompt), arrays already packed as on the wire."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(1024, 4096)
        out.append(packed_trajectory([rng.randrange(32_000) for _ in range(n)], prompt=256))
    return out


def push_body(node_id: str, lease_id: str, task_id: str, traj: dict, reward: float) -> bytes:
    return msgpack.packb(
        {
            "idempotency_key": new_id("push"),
            "node_id": node_id,
            "lease_id": lease_id,
            "episodes": [
                {
                    "id": new_id("ep"),
                    "task_id": task_id,
                    "trajectories": [traj],
                    "rewards": {"agent": reward},
                    "finish_reason": "terminated",
                }
            ],
        },
        use_bin_type=True,
    )


#: Where the service's Python CPU time goes, by the frame a sample passes through.
PROFILE_BUCKETS = [
    ("HTTP parsing/writing (uvicorn, httptools)", "HttpToolsProtocol"),
    ("push: decode + validate (msgpack, numpy, pydantic)", "decode_push"),
    ("push: store transaction (SQL, group formation)", "ingest.py"),
    ("lease: store transaction", "leases.py"),
    ("batches: selection + assembly", "batching.py"),
    ("FastAPI routes (JSON, status, others)", "fastapi/routing.py"),
    ("store writer loop outside operations (commit)", "store.py"),
]


def summarize_profile(path: Path) -> list[tuple[str, float]]:
    counts: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        for label, needle in PROFILE_BUCKETS:
            if needle in stack:
                counts[label] = counts.get(label, 0) + int(n)
                break
        else:
            counts["other (asyncio, plumbing)"] = counts.get("other (asyncio, plumbing)", 0) + int(
                n
            )
    return sorted(((k, v / max(total, 1)) for k, v in counts.items()), key=lambda kv: -kv[1])


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


@dataclass
class PhaseSpec:
    """What one phase offers the service; sent to every load worker."""

    url: str
    clients: int
    group_size: int
    #: total offered pushes/s spread over the clients (None: closed loop, as fast as served)
    rate: float | None
    #: long-poll of a lease request at the service, as real nodes do (rollout.lease_wait_s)
    lease_wait_s: float = 5.0
    #: the simulated nodes' HTTP client: "aiohttp" (:class:`AiohttpNode`) or "httpx"
    client: str = "aiohttp"


class AiohttpNode:
    """A simulated node's wire calls over aiohttp: the same requests as
    :class:`DataflowClient` (msgpack bodies encoded by the protocol codec, bearer token, replies
    decoded into the protocol types) at about a third of httpx's CPU per request. On a 2-core
    machine the load generator's CPU is taken from the service it measures; ``--client httpx``
    runs the nodes on the product's client instead."""

    def __init__(self, url: str) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(
            base_url=url,
            headers={
                "authorization": f"Bearer {TOKEN}",
                "content-type": MSGPACK,
                "accept": MSGPACK,
            },
            connector=aiohttp.TCPConnector(limit=2),
            timeout=aiohttp.ClientTimeout(total=120),
        )

    async def call(self, path: str, body: bytes, reply: type):
        async with self.session.post(path, data=body) as resp:
            data = await resp.read()
            if resp.status >= 400:
                raise RuntimeError(f"POST {path}: HTTP {resp.status}: {data[:300]!r}")
            return decode(reply, data, MSGPACK)

    async def register(self, name: str) -> str:
        reg = NodeRegistration(policies={"policy": 0}, name=name)
        return (await self.call("/nodes/register", encode(reg), NodeRegistered)).node_id

    async def lease(self, node_id: str, wait_s: float) -> LeaseGrant:
        req = LeaseRequest(
            node_id=node_id,
            max_tasks=1,
            versions={"policy": 0},
            wait_s=wait_s,
            idempotency_key=new_id("lease-req"),
        )
        return await self.call("/leases", encode(req), LeaseGrant)

    async def push(self, body: bytes) -> PushResult:
        return await self.call("/trajectories", body, PushResult)

    async def heartbeat(self, node_id: str) -> None:
        hb = Heartbeat(versions={"policy": 0})
        await self.call(f"/nodes/{node_id}/heartbeat", encode(hb), HeartbeatReply)

    async def close(self) -> None:
        await self.session.close()


class HttpxNode:
    """The same calls on the product's :class:`DataflowClient` (httpx)."""

    def __init__(self, url: str) -> None:
        self.client = DataflowClient(url, TOKEN, timeout=120, retries=3, max_connections=2)

    async def register(self, name: str) -> str:
        return (await self.client.register(policies={"policy": 0}, name=name)).node_id

    async def lease(self, node_id: str, wait_s: float) -> LeaseGrant:
        return await self.client.lease(
            node_id=node_id, max_tasks=1, versions={"policy": 0}, wait_s=wait_s
        )

    async def push(self, body: bytes) -> PushResult:
        return await self.client.request("POST", "/trajectories", body, PushResult)

    async def heartbeat(self, node_id: str) -> None:
        await self.client.heartbeat(node_id, versions={"policy": 0})

    async def close(self) -> None:
        await self.client.close()


def load_worker(spec: PhaseSpec, first: int, count: int, ready, stop, results) -> None:
    """One load-generator process: ``count`` simulated nodes, each with its own client (as on
    separate machines), on one event loop. Sends back every push and lease as (end time on the
    monotonic clock, which all processes of the machine share; latency)."""
    import uvloop

    uvloop.run(_worker(spec, first, count, ready, stop, results))


async def _worker(spec: PhaseSpec, first: int, count: int, ready, stop, results) -> None:
    templates = episode_templates(16)
    pushes: list[tuple[float, float]] = []
    leases: list[tuple[float, float]] = []
    errors = [0]
    done = asyncio.Event()
    interval = spec.clients / spec.rate if spec.rate else 0.0
    node_cls = AiohttpNode if spec.client == "aiohttp" else HttpxNode
    clients = [node_cls(spec.url) for _ in range(count)]
    node_ids = await asyncio.gather(
        *(c.register(f"sim-{first + i}") for i, c in enumerate(clients))
    )
    loop = asyncio.get_running_loop()

    async def node(i: int) -> None:
        rng = random.Random(first + i)
        client, node_id = clients[i], node_ids[i]
        next_push = loop.time() + rng.random() * interval
        last_hb = loop.time()
        while not done.is_set():
            t0 = time.monotonic()
            grant = await client.lease(node_id, spec.lease_wait_s)
            leases.append((time.monotonic(), time.monotonic() - t0))
            assert isinstance(grant, LeaseGrant)
            for lease in grant.leases:
                for _ in range(spec.group_size):
                    if interval:  # paced: this node pushes rate/clients episodes per second
                        next_push += interval
                        delay = next_push - loop.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                    body = push_body(
                        node_id,
                        lease.id,
                        lease.task.id,
                        rng.choice(templates),
                        float(rng.random() < 0.5),
                    )
                    t0 = time.monotonic()
                    res = await client.push(body)
                    t1 = time.monotonic()
                    pushes.append((t1, t1 - t0))
                    errors[0] += 0 if res.accepted else 1
            if loop.time() - last_hb > 2.0:
                await client.heartbeat(node_id)
                last_hb = loop.time()

    tasks = [asyncio.create_task(node(i)) for i in range(count)]
    ready.put(os.getpid())
    await loop.run_in_executor(None, stop.wait)
    done.set()
    # parked lease requests answer within lease_wait_s; do not wait for them
    await asyncio.wait(tasks, timeout=1.0)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in clients:
        await c.close()
    results.put({"pushes": pushes, "leases": leases, "rejected": errors[0]})


async def trainer_loop(
    client: DataflowClient, batch_groups: int, step_s: float, stop: asyncio.Event, log: list
) -> None:
    """A trainer that keeps up: pulls the next batch as soon as it is ready (long poll), waits
    ``step_s`` (the optimizer step; 0 by default) and acknowledges it."""
    version = 0
    while not stop.is_set():
        t0 = time.monotonic()
        reply = await client.request(
            "POST",
            "/batches",
            msgpack.packb(
                {
                    "policy": "policy",
                    "num_groups": batch_groups,
                    "trainer_version": version,
                    "wait_s": 1.0,
                }
            ),
            None,
            extra_timeout=1.0,
        )
        batch = reply.get("batch")
        if batch is None:
            continue
        log.append(
            (
                time.monotonic(),
                time.monotonic() - t0,
                sum(len(g["samples"]) for g in batch["groups"]),
            )
        )
        if step_s:
            await asyncio.sleep(step_s)
        version += 1
        await client.request(
            "POST",
            f"/batches/{batch['id']}/ack",
            msgpack.packb({"idempotency_key": new_id("ack"), "trainer_version": version}),
        )


def _in(window: tuple[float, float], records: list) -> list:
    return [r for r in records if window[0] <= r[0] < window[1]]


async def run_phase(
    spec: PhaseSpec,
    workers: int,
    duration: float,
    warmup: float,
    batch_groups: int,
    step_s: float,
    service: ServiceProcess,
    profile: Path | None = None,
) -> dict:
    ctx = mp.get_context("spawn")
    ready, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    workers = max(1, min(workers, spec.clients))
    shares = [
        spec.clients // workers + (1 if w < spec.clients % workers else 0) for w in range(workers)
    ]
    firsts = [sum(shares[:w]) for w in range(workers)]
    procs = [
        ctx.Process(target=load_worker, args=(spec, firsts[w], shares[w], ready, stop, results))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    client = DataflowClient(spec.url, TOKEN, timeout=120, retries=3, max_connections=4)
    trainer_stop, batch_log = asyncio.Event(), []
    try:
        loop = asyncio.get_running_loop()
        pids = [await loop.run_in_executor(None, ready.get, True, 600) for _ in procs]
        gens = [psutil.Process(pid) for pid in pids]
        trainer = asyncio.create_task(
            trainer_loop(client, batch_groups, step_s, trainer_stop, batch_log)
        )
        await asyncio.sleep(warmup)
        status0 = await client.status()
        gen_cpu0 = sum(sum(g.cpu_times()[:2]) for g in gens)
        cpu0, t0 = service.cpu_s(), time.monotonic()
        spy = service.start_profile(profile, duration) if profile else None
        await asyncio.sleep(duration)
        t1 = time.monotonic()
        cpu1 = service.cpu_s()
        gen_cpu1 = sum(sum(g.cpu_times()[:2]) for g in gens)
        status1 = await client.status()
        stop.set()
        outs = [await loop.run_in_executor(None, results.get, True, 120) for _ in procs]
        trainer_stop.set()
        await asyncio.wait_for(trainer, timeout=30)
    finally:
        stop.set()
        await client.close()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if spy is not None:
        spy.wait(timeout=60)
    window, elapsed = (t0, t1), t1 - t0
    push_lat = [lat for o in outs for _, lat in _in(window, o["pushes"])]
    lease_lat = [lat for o in outs for _, lat in _in(window, o["leases"])]
    batches = _in(window, batch_log)
    pushes = len(push_lat)
    commits = status1["store"]["commits"] - status0["store"]["commits"]
    return {
        "clients": spec.clients,
        "offered": f"{spec.rate:.0f}/s" if spec.rate else "max",
        "load_workers": workers,
        "client": spec.client,
        "seconds": round(elapsed, 2),
        "pushes": pushes,
        "pushes_per_s": pushes / elapsed,
        "p50_ms": pct(push_lat, 0.50) * 1000,
        "p99_ms": pct(push_lat, 0.99) * 1000,
        "lease_p50_ms": pct(lease_lat, 0.50) * 1000,
        "lease_p99_ms": pct(lease_lat, 0.99) * 1000,
        "batches_per_s": len(batches) / elapsed,
        "batch_p50_ms": pct([b[1] for b in batches], 0.50) * 1000,
        "samples_per_s_to_trainer": sum(b[2] for b in batches) / elapsed,
        "service_cpu_s_per_1k_pushes": (cpu1 - cpu0) / max(pushes, 1) * 1000,
        "service_cpu_util": (cpu1 - cpu0) / elapsed,
        # pushes the service handles per second of its own CPU: its capacity on one free core,
        # independent of how much CPU the (shared) machine left it during the run
        "pushes_per_service_cpu_s": pushes / max(cpu1 - cpu0, 1e-9),
        "client_cpu_util": (gen_cpu1 - gen_cpu0) / elapsed,
        "commits_per_s": commits / elapsed,
        "ops_per_commit": (status1["store"]["ops"] - status0["store"]["ops"]) / max(commits, 1),
        "commit_ms": 1000
        * (status1["store"]["commit_seconds"] - status0["store"]["commit_seconds"])
        / max(commits, 1),
        "writer_busy": (
            status1["store"]["commit_seconds"]
            - status0["store"]["commit_seconds"]
            + status1["store"]["op_seconds"]
            - status0["store"]["op_seconds"]
        )
        / elapsed,
        "rejected_pushes": sum(o["rejected"] for o in outs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short phases (< 2 min in all)")
    ap.add_argument("--clients", type=int, nargs="*", default=[64, 256])
    ap.add_argument(
        "--paced-clients",
        type=int,
        nargs="*",
        default=[256],
        help="phases whose clients together offer --rate pushes/s",
    )
    ap.add_argument("--rate", type=float, default=1100.0, help="offered pushes/s when paced")
    ap.add_argument("--duration", type=float, default=None, help="measured seconds per phase")
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--batch-groups", type=int, default=16)
    ap.add_argument(
        "--step-s",
        type=float,
        default=0.0,
        help="simulated optimizer step time (0: a trainer that keeps up with any rate)",
    )
    ap.add_argument(
        "--buffer-steps",
        type=int,
        default=None,
        help="dataflow.buffer_steps (backpressure cap in optimizer steps); default: room for "
        "every client to hold a task plus two batches buffered, so that the cap does not set "
        "the pace (the bench measures the service, not a trainer's consumption)",
    )
    ap.add_argument(
        "--workers",
        type=int,
        default=2,
        help="load-generator processes (the simulated nodes are spread over them)",
    )
    ap.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    ap.add_argument(
        "--client",
        default="aiohttp",
        choices=["aiohttp", "httpx"],
        help="the simulated nodes' HTTP client (httpx: the product's DataflowClient, ~3x the CPU "
        "per request, taken from the service on a small machine)",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="profile the service with py-spy (GIL-holding samples) to PATH.CLIENTS per phase",
    )
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    args = ap.parse_args()
    duration = args.duration or (10.0 if args.quick else 30.0)
    warmup = args.warmup if args.warmup is not None else (3.0 if args.quick else 8.0)
    results = []
    # Closed loop (every client pushes as fast as it can) measures capacity; a paced phase offers
    # a fixed total rate spread over the clients and measures latency at that load.
    phases = [(c, None) for c in args.clients] + [(c, args.rate) for c in args.paced_clients]
    for clients, rate in phases:
        with tempfile.TemporaryDirectory(prefix="df-bench-") as tmp:
            workdir = Path(tmp)
            buffer_steps = args.buffer_steps
            if buffer_steps is None:
                buffer_steps = -(-clients // args.batch_groups) + 2
            recipe = write_recipe(workdir, args.group_size, args.batch_groups, buffer_steps)
            profile = (
                Path(f"{args.profile}.{clients}{'-paced' if rate else ''}")
                if args.profile
                else None
            )
            service = ServiceProcess(workdir, recipe, args.synchronous)
            offered = f"{rate:.0f} pushes/s offered" if rate else "closed loop"
            console.print(
                f"[bold]phase[/] {clients} clients in {min(args.workers, clients)} load processes, "
                f"{offered}, {duration:.0f}s (+{warmup:.0f}s warm-up) against {service.url}"
            )
            spec = PhaseSpec(service.url, clients, args.group_size, rate, client=args.client)
            try:
                results.append(
                    asyncio.run(
                        run_phase(
                            spec,
                            args.workers,
                            duration,
                            warmup,
                            args.batch_groups,
                            args.step_s,
                            service,
                            profile,
                        )
                    )
                )
            finally:
                service.stop()
    table = Table(
        title=f"dataflow load (synchronous={args.synchronous}, group_size "
        f"{args.group_size}, batch {args.batch_groups} groups, {os.cpu_count()} CPUs)"
    )
    cols = [
        ("clients", "clients", "{:d}"),
        ("offered", "offered", "{}"),
        ("pushes/s", "pushes_per_s", "{:.0f}"),
        ("push p50 ms", "p50_ms", "{:.1f}"),
        ("push p99 ms", "p99_ms", "{:.1f}"),
        ("lease p50 ms", "lease_p50_ms", "{:.1f}"),
        ("lease p99 ms", "lease_p99_ms", "{:.1f}"),
        ("batches/s", "batches_per_s", "{:.2f}"),
        ("svc CPU s/1k pushes", "service_cpu_s_per_1k_pushes", "{:.2f}"),
        ("pushes per svc CPU-s", "pushes_per_service_cpu_s", "{:.0f}"),
        ("svc CPU", "service_cpu_util", "{:.0%}"),
        ("client CPU", "client_cpu_util", "{:.0%}"),
        ("commits/s", "commits_per_s", "{:.0f}"),
        ("ops/commit", "ops_per_commit", "{:.1f}"),
        ("commit ms", "commit_ms", "{:.1f}"),
        ("writer busy", "writer_busy", "{:.0%}"),
    ]
    for title, _, _ in cols:
        table.add_column(title, justify="right")
    for r in results:
        table.add_row(*[fmt.format(r[key]) for _, key, fmt in cols])
    console.print(table)
    if args.profile:
        for r in results:
            path = Path(f"{args.profile}.{r['clients']}{'' if r['offered'] == 'max' else '-paced'}")
            if not path.exists():
                continue
            prof = Table(title=f"service CPU by component ({r['clients']} clients, {r['offered']})")
            prof.add_column("component")
            prof.add_column("share of GIL samples", justify="right")
            for label, share in summarize_profile(path):
                prof.add_row(label, f"{share:.0%}")
            r["profile"] = dict(summarize_profile(path))
            console.print(prof)
    if args.json:
        closed = [r for r in results if r["offered"] == "max"] or results
        paced = [r for r in results if r["offered"] != "max"] or closed
        top = max(paced, key=lambda r: r["clients"])
        _stamp.write_json(
            args.json,
            {
                "pushes_per_s": top["pushes_per_s"],
                "p50_ms": top["p50_ms"],
                "p99_ms": top["p99_ms"],
                "clients": top["clients"],
                "offered": top["offered"],
                "service_cpu_ms_per_push": top["service_cpu_s_per_1k_pushes"],
                "max_pushes_per_s": max(r["pushes_per_s"] for r in closed),
                "synchronous": args.synchronous,
                "phases": results,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
