"""Load benchmark of the dataflow service (not a test).

Many concurrent simulated rollout nodes (64 and 256 client tasks) lease tasks and push realistic
episodes (1-4k tokens, one episode per push, packed msgpack arrays) while a trainer client pulls
and acknowledges batches. The service runs as a real ``astraflow serve dataflow`` child process
with its SQLite store; clients use :class:`astraflow.protocol.client.DataflowClient` over loopback.

Reports per phase: episode pushes/s, push latency p50/p99, lease latency p50/p99, batches/s,
service CPU seconds per 1k pushes, SQLite commits per second (group commit at work).

    python tests/bench/dataflow_load.py --quick --json out.json
    python tests/bench/dataflow_load.py --clients 64 256 --duration 30 --synchronous NORMAL
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import psutil
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from astraflow.protocol import LeaseGrant, PushResult, new_id  # noqa: E402
from astraflow.protocol.client import DataflowClient  # noqa: E402
from astraflow.recipe import Recipe, recipe_to_toml  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 160)
TOKEN = "bench-token"


def write_recipe(workdir: Path, group_size: int, groups_per_step: int) -> Path:
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
            "dataflow": {"lease_timeout_s": 120.0, "max_lag": 10**6},
        }
    )
    path = workdir / "recipe.toml"
    path.write_text(recipe_to_toml(recipe))
    return path


class ServiceProcess:
    def __init__(self, workdir: Path, recipe: Path, synchronous: str, profile: Path | None):
        self.workdir = workdir
        port_file = workdir / "port"
        cmd = [sys.executable]
        if profile is not None:
            cmd += ["-m", "cProfile", "-o", str(profile)]
        cmd += [
            "-m",
            "cli.main",
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


def episode_templates(count: int, seed: int = 0) -> list[dict]:
    """Trajectories of 1-4k tokens (256-token prompt), arrays already packed as on the wire."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(1024, 4096)
        prompt = 256
        tokens = np.asarray([rng.randrange(32_000) for _ in range(n)], dtype="<i4")
        mask = np.asarray([0] * prompt + [1] * (n - prompt), dtype="<i4")
        logprobs = np.where(mask == 1, -0.7, 0.0).astype("<f4")
        versions = np.where(mask == 1, 0, -1).astype("<i4")
        out.append(
            {
                "role": "agent",
                "tokens": tokens.tobytes(),
                "loss_mask": mask.tobytes(),
                "logprobs": logprobs.tobytes(),
                "versions": versions.tobytes(),
                "num_turns": 1,
            }
        )
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


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def run_phase(
    url: str,
    clients: int,
    duration: float,
    warmup: float,
    group_size: int,
    batch_groups: int,
    step_s: float,
    templates: list[dict],
    service: ServiceProcess,
) -> dict:
    state = {"measuring": False, "pushes": 0, "leases": 0, "batches": 0, "samples": 0, "errors": 0}
    push_lat: list[float] = []
    lease_lat: list[float] = []
    batch_lat: list[float] = []
    stop = asyncio.Event()
    # One client (connection pool) per simulated node, as on separate machines; a single httpx
    # pool shared by hundreds of tasks costs O(connections) per request on the client side.
    client = DataflowClient(url, TOKEN, timeout=120, retries=3, max_connections=4)
    node_clients = [
        DataflowClient(url, TOKEN, timeout=120, retries=3, max_connections=2)
        for _ in range(clients)
    ]

    async def node(i: int) -> None:
        rng = random.Random(i)
        client = node_clients[i]
        node_id = (await client.register(policies={"policy": 0}, name=f"sim-{i}")).node_id
        last_hb = time.monotonic()
        while not stop.is_set():
            t0 = time.perf_counter()
            grant = await client.lease(node_id=node_id, max_tasks=1, versions={"policy": 0})
            if state["measuring"]:
                lease_lat.append(time.perf_counter() - t0)
                state["leases"] += 1
            assert isinstance(grant, LeaseGrant)
            for lease in grant.leases:
                for _ in range(group_size):
                    body = push_body(
                        node_id,
                        lease.id,
                        lease.task.id,
                        rng.choice(templates),
                        float(rng.random() < 0.5),
                    )
                    t0 = time.perf_counter()
                    res = await client.request("POST", "/trajectories", body, PushResult)
                    if state["measuring"]:
                        push_lat.append(time.perf_counter() - t0)
                        state["pushes"] += 1
                        state["errors"] += 0 if res.accepted else 1
            if not grant.leases:
                await asyncio.sleep(0.05)
            if time.monotonic() - last_hb > 2.0:
                await client.heartbeat(node_id, versions={"policy": 0})
                last_hb = time.monotonic()

    async def trainer() -> None:
        version = 0
        while not stop.is_set():
            t0 = time.perf_counter()
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
            if state["measuring"]:
                batch_lat.append(time.perf_counter() - t0)
                state["batches"] += 1
                state["samples"] += sum(len(g["samples"]) for g in batch["groups"])
            await asyncio.sleep(step_s)  # the optimizer step
            version += 1
            await client.request(
                "POST",
                f"/batches/{batch['id']}/ack",
                msgpack.packb({"idempotency_key": new_id("ack"), "trainer_version": version}),
            )

    tasks = [asyncio.create_task(node(i)) for i in range(clients)]
    tasks.append(asyncio.create_task(trainer()))
    await asyncio.sleep(warmup)
    status0 = await client.status()
    cpu0, client_cpu0, t0 = service.cpu_s(), time.process_time(), time.perf_counter()
    state["measuring"] = True
    await asyncio.sleep(duration)
    state["measuring"] = False
    elapsed = time.perf_counter() - t0
    cpu1, client_cpu1 = service.cpu_s(), time.process_time()
    status1 = await client.status()
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    for c in node_clients:
        await c.close()
    pushes = state["pushes"]
    commits = status1["store"]["commits"] - status0["store"]["commits"]
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "pushes": pushes,
        "pushes_per_s": pushes / elapsed,
        "p50_ms": pct(push_lat, 0.50) * 1000,
        "p99_ms": pct(push_lat, 0.99) * 1000,
        "lease_p50_ms": pct(lease_lat, 0.50) * 1000,
        "lease_p99_ms": pct(lease_lat, 0.99) * 1000,
        "batches_per_s": state["batches"] / elapsed,
        "batch_p50_ms": pct(batch_lat, 0.50) * 1000,
        "samples_per_s_to_trainer": state["samples"] / elapsed,
        "service_cpu_s_per_1k_pushes": (cpu1 - cpu0) / max(pushes, 1) * 1000,
        "service_cpu_util": (cpu1 - cpu0) / elapsed,
        "client_cpu_util": (client_cpu1 - client_cpu0) / elapsed,
        "commits_per_s": commits / elapsed,
        "ops_per_commit": (status1["store"]["ops"] - status0["store"]["ops"]) / max(commits, 1),
        "rejected_pushes": state["errors"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short phases (< 2 min in all)")
    ap.add_argument("--clients", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--duration", type=float, default=None, help="measured seconds per phase")
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--batch-groups", type=int, default=16)
    ap.add_argument("--step-s", type=float, default=0.5, help="simulated optimizer step time")
    ap.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    ap.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write a cProfile of the service (main thread) per phase to PATH.N",
    )
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    args = ap.parse_args()
    duration = args.duration or (12.0 if args.quick else 30.0)
    warmup = args.warmup if args.warmup is not None else (4.0 if args.quick else 8.0)
    templates = episode_templates(16)
    results = []
    for clients in args.clients:
        with tempfile.TemporaryDirectory(prefix="df-bench-") as tmp:
            workdir = Path(tmp)
            recipe = write_recipe(workdir, args.group_size, args.batch_groups)
            profile = Path(f"{args.profile}.{clients}") if args.profile else None
            service = ServiceProcess(workdir, recipe, args.synchronous, profile)
            console.print(
                f"[bold]phase[/] {clients} clients for {duration:.0f}s "
                f"(+{warmup:.0f}s warm-up) against {service.url}"
            )
            try:
                results.append(
                    asyncio.run(
                        run_phase(
                            service.url,
                            clients,
                            duration,
                            warmup,
                            args.group_size,
                            args.batch_groups,
                            args.step_s,
                            templates,
                            service,
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
        ("pushes/s", "pushes_per_s", "{:.0f}"),
        ("push p50 ms", "p50_ms", "{:.1f}"),
        ("push p99 ms", "p99_ms", "{:.1f}"),
        ("lease p50 ms", "lease_p50_ms", "{:.1f}"),
        ("lease p99 ms", "lease_p99_ms", "{:.1f}"),
        ("batches/s", "batches_per_s", "{:.2f}"),
        ("svc CPU s/1k pushes", "service_cpu_s_per_1k_pushes", "{:.2f}"),
        ("svc CPU", "service_cpu_util", "{:.0%}"),
        ("client CPU", "client_cpu_util", "{:.0%}"),
        ("commits/s", "commits_per_s", "{:.0f}"),
        ("ops/commit", "ops_per_commit", "{:.1f}"),
    ]
    for title, _, _ in cols:
        table.add_column(title, justify="right")
    for r in results:
        table.add_row(*[fmt.format(r[key]) for _, key, fmt in cols])
    console.print(table)
    if args.json:
        top = max(results, key=lambda r: r["clients"])
        args.json.write_text(
            json.dumps(
                {
                    "pushes_per_s": top["pushes_per_s"],
                    "p50_ms": top["p50_ms"],
                    "p99_ms": top["p99_ms"],
                    "clients": top["clients"],
                    "synchronous": args.synchronous,
                    "phases": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
