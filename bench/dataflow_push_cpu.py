"""CPU per trajectory push inside the dataflow service, per thread (not a test).

Why beside ``dataflow_load.py``: on a shared machine, throughput and latency over loopback say
more about the neighbours than about the service. This drives the real ASGI app in-process (the
auth guard, the msgpack fast path, decoding, the store transaction with group commit, the reply;
uvicorn's socket handling is left out) with 64 concurrent pushes of 1-4k-token episodes, and
reports the CPU time each thread of the service spent per push (psutil per-thread times), which
neighbours disturb far less than wall time.

    python bench/dataflow_push_cpu.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import _stamp
import msgpack
import psutil
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from astraflow.tasks.catalog import load_task_set  # noqa: E402
from dataflow_load import TOKEN, episode_templates, push_body, write_recipe  # noqa: E402

from astraflow.dataflow.http.app import create_app  # noqa: E402
from astraflow.protocol import LeaseRequest, NodeRegistration  # noqa: E402
from astraflow.recipe import load_recipe  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 160)
HEADERS = [
    (b"authorization", f"Bearer {TOKEN}".encode()),
    (b"content-type", b"application/msgpack"),
    (b"accept", b"application/msgpack"),
]


async def call(app, body: bytes) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/trajectories",
        "headers": [*HEADERS, (b"content-length", str(len(body)).encode())],
        "query_string": b"",
    }
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    reply: dict = {}

    async def receive():
        return messages.pop()

    async def send(message):
        if message["type"] == "http.response.start":
            reply["status"] = message["status"]
        else:
            reply["body"] = message["body"]

    await app(scope, receive, send)
    return reply["status"], reply["body"]


def thread_cpu() -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


async def measure(tasks: int, concurrency: int, synchronous: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="df-cpu-") as tmp:
        workdir = Path(tmp)
        recipe = load_recipe(write_recipe(workdir, 4, 16, 0))
        app = create_app(
            recipe, workdir / "df.db", TOKEN, task_source=load_task_set, synchronous=synchronous
        )
        service = app.state.service
        await service.start()
        try:
            node = (await service.register(NodeRegistration(policies={"policy": 0}))).node_id
            grant = await service.lease(
                LeaseRequest(node_id=node, max_tasks=tasks, versions={"policy": 0})
            )
            templates, rng = episode_templates(16), random.Random(0)
            bodies = [
                push_body(node, lease.id, lease.task.id, rng.choice(templates), rng.random() < 0.5)
                for lease in grant.leases
                for _ in range(4)
            ]
            warm, bodies = bodies[:40], bodies[40:]
            for body in warm:
                assert (await call(app, body))[0] == 200
            names = {t.native_id: t.name for t in threading.enumerate()}
            gate = asyncio.Semaphore(concurrency)

            async def one(body: bytes) -> None:
                async with gate:
                    status, reply = await call(app, body)
                    assert status == 200 and msgpack.unpackb(reply)["accepted"], reply

            before, cpu0, t0 = thread_cpu(), time.process_time(), time.perf_counter()
            await asyncio.gather(*(one(b) for b in bodies))
            after, cpu1, t1 = thread_cpu(), time.process_time(), time.perf_counter()
        finally:
            await service.stop()
    n = len(bodies)
    per_thread = {
        names.get(tid, str(tid)): (cpu - before.get(tid, 0.0)) / n * 1e6
        for tid, cpu in after.items()
        if cpu - before.get(tid, 0.0) > 0
    }
    return {
        "pushes": n,
        "cpu_us_per_push": (cpu1 - cpu0) / n * 1e6,
        "wall_us_per_push": (t1 - t0) / n * 1e6,
        "threads_us_per_push": per_thread,
        "synchronous": synchronous,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=400, help="groups of 4 pushes")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the table shows each")
    ap.add_argument("--synchronous", default="NORMAL", choices=["FULL", "NORMAL"])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    runs = [
        asyncio.run(measure(args.tasks, args.concurrency, args.synchronous))
        for _ in range(args.repeat)
    ]
    table = Table(title=f"dataflow CPU per push, in-process ASGI, synchronous={args.synchronous}")
    threads = sorted({name for r in runs for name in r["threads_us_per_push"]})
    for col in ["run", "pushes", "CPU us/push", *[f"{t} us/push" for t in threads]]:
        table.add_column(col, justify="right")
    for i, r in enumerate(runs):
        table.add_row(
            str(i + 1),
            str(r["pushes"]),
            f"{r['cpu_us_per_push']:.0f}",
            *[f"{r['threads_us_per_push'].get(t, 0.0):.0f}" for t in threads],
        )
    console.print(table)
    best = min(runs, key=lambda r: r["cpu_us_per_push"])
    if args.json:
        _stamp.write_json(args.json, {"cpu_us_per_push": best["cpu_us_per_push"], "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
