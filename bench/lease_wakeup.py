"""Lease wake-up latency benchmark (not a test).

How long after a task becomes leasable does a waiting rollout node hold it? Several simulated
nodes (each its own :class:`astraflow.protocol.client.DataflowClient`, as separate nodes would
be) keep a long-polling lease request parked at a real ``astraflow serve dataflow`` child process
on loopback. Backpressure (``buffer_steps = 1``, one group per step: one task in flight at a time)
keeps them waiting until an event frees room; the benchmark then triggers one event at a time and
times the first node that receives the task. Event kinds:

* ``release``: the node holding the task gives its lease back (``POST /leases/release``);
* ``push``: the holder pushes a zero-variance group, which the ``zero_variance_filter`` drops at
  ingestion, so the in-flight slot frees with nothing buffered (``POST /trajectories``);
* ``batch``: the trainer pulls the buffered group (``POST /batches``), then acknowledges it.

``lease_wakeup_ms`` runs from the moment the event's request is SENT (an upper bound: it includes
that request's own transit and commit) to the moment a waiting node's lease reply arrives. Events
are spaced by a random 20-60 ms pause, so every measurement starts from parked, idle waiters.

Measured: ``--quick``, 8 waiting nodes on loopback, p50 5-13 ms and p99 9-30 ms from the event's
request being sent.

    python bench/lease_wakeup.py --quick --json out.json
    python bench/lease_wakeup.py --nodes 16 --events 300
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _stamp
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dataflow_load import ServiceProcess  # noqa: E402

from astraflow.protocol import Episode, Trajectory  # noqa: E402
from astraflow.protocol.client import DataflowClient  # noqa: E402
from astraflow.recipe import Recipe, recipe_to_toml  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 160)
TOKEN = "bench-token"
KINDS = ("release", "push", "batch")
WAIT_S = 10.0


def write_recipe(workdir: Path, group_size: int) -> Path:
    recipe = Recipe.model_validate(
        {
            "run": {"name": "wakeup", "output_dir": str(workdir / "runs"), "max_steps": 10**6},
            "policies": {
                "policy": {"model": "builtin:tiny-arith", "trainer": {"groups_per_step": 1}}
            },
            "tasks": {"group_size": group_size},
            "dataflow": {
                "lease_timeout_s": 600.0,
                "max_lag": 10**6,
                "buffer_steps": 1,
                "policies": [{"name": "zero_variance_filter"}],
            },
        }
    )
    path = workdir / "recipe.toml"
    path.write_text(recipe_to_toml(recipe))
    return path


def group(task_id: str, rewards: list[float]) -> list[Episode]:
    traj = Trajectory(
        role="agent",
        tokens=list(range(100, 132)),
        loss_mask=[0] * 16 + [1] * 16,
        logprobs=[0.0] * 16 + [-0.5] * 16,
        versions=[-1] * 16 + [0] * 16,
    )
    return [Episode(task_id=task_id, trajectories=[traj], rewards={"agent": r}) for r in rewards]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


async def waiter(url: str, node_id: str, got: asyncio.Queue, stop: asyncio.Event) -> None:
    """A node that always has a free slot: parks a lease request, reports each grant, re-asks."""
    async with DataflowClient(url, TOKEN) as client:
        while not stop.is_set():
            grant = await client.lease(
                node_id=node_id, max_tasks=1, versions={"policy": 0}, wait_s=WAIT_S
            )
            now = time.perf_counter()
            for lease in grant.leases:
                await got.put((now, node_id, lease))


async def run(url: str, nodes: int, events: int, group_size: int) -> dict[str, dict]:
    got: asyncio.Queue = asyncio.Queue()
    stop = asyncio.Event()
    async with DataflowClient(url, TOKEN) as ctl:
        ids = [(await ctl.register(policies={"policy": 0}, name=f"n{i}")).node_id
               for i in range(nodes)]  # fmt: skip
        tasks = [asyncio.create_task(waiter(url, nid, got, stop)) for nid in ids]
        # the first node to ask takes the one task backpressure allows; the rest park
        _, holder, lease = await asyncio.wait_for(got.get(), 30)
        results: dict[str, dict] = {}
        rng = random.Random(0)
        for kind in KINDS:
            wake: list[float] = []
            event_ms: list[float] = []
            for _ in range(events):
                if kind == "batch":
                    # buffer a good group (room stays 0: in flight -> ready), then free it by
                    # serving it to the trainer
                    await ctl.push(
                        node_id=holder, lease_id=lease.id, episodes=group(lease.task.id,
                        [1.0, 0.0] * (group_size // 2) + [1.0] * (group_size % 2)),
                    )  # fmt: skip
                await asyncio.sleep(rng.uniform(0.02, 0.06))
                assert got.empty(), "a node got a task before the event"
                sent = time.perf_counter()
                if kind == "release":
                    await ctl.release(holder, [lease.id])
                elif kind == "push":
                    await ctl.push(
                        node_id=holder, lease_id=lease.id,
                        episodes=group(lease.task.id, [1.0] * group_size),
                    )  # fmt: skip
                else:
                    reply = await ctl.next_batch(policy="policy", num_groups=1, trainer_version=0)
                    assert reply.batch is not None, reply.reason
                event_ms.append((time.perf_counter() - sent) * 1000)
                at, holder, lease = await asyncio.wait_for(got.get(), WAIT_S + 10)
                wake.append((at - sent) * 1000)
                if kind == "batch":
                    await ctl.ack(reply.batch.id, trainer_version=0)
            results[kind] = {
                "events": len(wake),
                "p50_ms": statistics.median(wake),
                "p99_ms": pct(wake, 99),
                "max_ms": max(wake),
                "event_request_p50_ms": statistics.median(event_ms),
                "samples": wake,
            }
        stop.set()
        await ctl.release(holder, [lease.id])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer events (< 1 min in all)")
    ap.add_argument("--nodes", type=int, default=8, help="waiting nodes")
    ap.add_argument("--events", type=int, default=None, help="events per kind")
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    ap.add_argument("--json", type=Path, default=None, help="write results here")
    args = ap.parse_args()
    events = args.events or (60 if args.quick else 300)
    with tempfile.TemporaryDirectory(prefix="wakeup-bench-") as tmp:
        workdir = Path(tmp)
        service = ServiceProcess(workdir, write_recipe(workdir, args.group_size), args.synchronous)
        console.print(
            f"[bold]lease wake-up[/]: {args.nodes} waiting nodes, {events} events per kind, "
            f"against {service.url}"
        )
        try:
            results = asyncio.run(run(service.url, args.nodes, events, args.group_size))
        finally:
            service.stop()
    everything = [x for r in results.values() for x in r["samples"]]
    table = Table(
        title=f"lease wake-up over loopback HTTP ({args.nodes} waiting nodes, "
        f"synchronous={args.synchronous}, {os.cpu_count()} CPUs)"
    )
    for col in ("event", "events", "wake-up p50 ms", "wake-up p99 ms", "max ms",
                "event request p50 ms"):  # fmt: skip
        table.add_column(col, justify="right")
    for kind, r in results.items():
        table.add_row(kind, str(r["events"]), f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                      f"{r['max_ms']:.1f}", f"{r['event_request_p50_ms']:.1f}")  # fmt: skip
    table.add_row("all", str(len(everything)), f"{statistics.median(everything):.1f}",
                  f"{pct(everything, 99):.1f}", f"{max(everything):.1f}", "")  # fmt: skip
    console.print(table)
    if args.json:
        out = {
            "lease_wakeup_ms_p50": statistics.median(everything),
            "lease_wakeup_ms_p99": pct(everything, 99),
            "nodes": args.nodes,
            "events_per_kind": events,
            "synchronous": args.synchronous,
        }
        for kind, r in results.items():
            out[f"lease_wakeup_ms_p50_{kind}"] = r["p50_ms"]
            out[f"lease_wakeup_ms_p99_{kind}"] = r["p99_ms"]
        _stamp.write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
