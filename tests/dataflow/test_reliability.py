"""Crash and failure behaviour with the service in a real child process on loopback.

- kill -9 in the middle of a stream of pushes, restart on the same store: every acknowledged push
  is there, none twice; pushes in flight are retried by the client (same idempotency key) and land
  exactly once.
- a node that stops heartbeating: its leases expire, another node completes the tasks; trainers
  receive exactly tasks x group_size samples, no duplicates.
- a trainer that pulls a batch and dies before acknowledging it gets the same batch again, also
  after the service itself was killed and restarted.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest
from dataflow_helpers import TOKEN, ServiceProcess, episode, group, make_recipe

from astraflow.protocol import TrajectoryPush
from astraflow.protocol.client import DataflowClient, SyncDataflowClient


def _drain_batches(client, policy="policy", num_groups=2):
    """Pull and ack batches until the service says no more data will come."""
    samples, groups, version = [], [], 0
    for _ in range(500):
        reply = client.next_batch(
            policy=policy, num_groups=num_groups, trainer_version=version, wait_s=2.0
        )
        if reply.done:
            return samples, groups
        if reply.batch is None:
            continue
        samples.extend(reply.batch.samples)
        groups.extend(g.task_id for g in reply.batch.groups)
        version += 1
        client.ack(reply.batch.id, trainer_version=version)
    raise AssertionError("batches never finished")


@pytest.mark.slow  # restarts the service process
def test_kill_9_mid_push_stream_loses_and_duplicates_nothing(tmp_path):
    n_tasks, group_size = 24, 2
    recipe = make_recipe(
        tmp_path,
        run={"name": "k", "output_dir": str(tmp_path / "runs"), "max_steps": 1000},
        tasks={
            "group_size": group_size,
            "epochs": 1,
            "sets": [{"name": "arith", "limit": n_tasks}],
        },
        dataflow={"lease_timeout_s": 600.0},
    )
    svc = ServiceProcess(recipe, tmp_path / "svc", tmp_path / "df.db")
    url = svc.start()
    with SyncDataflowClient(url, TOKEN, retries=0) as c:
        node = c.register(policies={"policy": 0}).node_id
        leases = c.lease(node_id=node, max_tasks=n_tasks, versions={"policy": 0}).leases
    assert len(leases) == n_tasks
    pushes = [
        TrajectoryPush(
            node_id=node,
            lease_id=lease.id,
            episodes=[
                episode(lease.task.id, reward=float(i % 2), n=2048) for i in range(group_size)
            ],
        )
        for lease in leases
    ]
    acked_before_kill: list[TrajectoryPush] = []
    results: dict[str, object] = {}
    killed = threading.Event()

    async def pusher():
        async with DataflowClient(
            url, TOKEN, retries=400, backoff_s=0.05, max_backoff_s=0.25
        ) as client:
            sem = asyncio.Semaphore(4)

            async def one(p):
                async with sem:
                    res = await client.push(p)
                    results[p.idempotency_key] = res
                    if not killed.is_set():
                        acked_before_kill.append(p)
                    await asyncio.sleep(0.05)

            await asyncio.gather(*(one(p) for p in pushes))

    t = threading.Thread(target=lambda: asyncio.run(pusher()))
    t.start()
    deadline = time.time() + 120
    while len(results) < n_tasks // 3 and time.time() < deadline:
        time.sleep(0.01)
    killed.set()
    svc.kill()
    assert len(results) < n_tasks, "the stream finished before the kill; make it longer"
    svc.start()  # same store, same port: the client's retries reach the new process
    try:
        t.join(timeout=300)
        assert not t.is_alive()
        assert len(results) == n_tasks and all(r.accepted for r in results.values())
        with SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
            # every push acknowledged before the kill is durable: a replay is a duplicate
            for p in acked_before_kill:
                again = c.push(p)
                assert again.accepted and again.duplicate
            st = c.status()
            assert st["tasks_done"] == n_tasks and st["episodes"] == n_tasks * group_size
            samples, task_ids = _drain_batches(c)
        assert len(samples) == n_tasks * group_size
        assert len({s.id for s in samples}) == len(samples)
        assert sorted(task_ids) == sorted(lease.task.id for lease in leases)
        assert all(len(s.tokens) == 2048 for s in samples)
    finally:
        svc.stop()


def test_silent_node_leases_expire_and_others_finish(tmp_path):
    n_tasks, group_size = 8, 3
    recipe = make_recipe(
        tmp_path,
        run={"name": "e", "output_dir": str(tmp_path / "runs"), "max_steps": 1000},
        tasks={
            "group_size": group_size,
            "epochs": 1,
            "sets": [{"name": "arith", "limit": n_tasks}],
        },
        dataflow={"lease_timeout_s": 1.0, "heartbeat_interval_s": 0.2},
    )
    with (
        ServiceProcess(recipe, tmp_path / "svc", tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=3) as c,
    ):
        silent = c.register(policies={"policy": 0}, name="silent").node_id
        taken = c.lease(node_id=silent, max_tasks=3, versions={"policy": 0}).leases
        assert len(taken) == 3
        worker = c.register(policies={"policy": 0}, name="worker").node_id
        done_tasks: list[str] = []
        deadline = time.time() + 60
        while len(done_tasks) < n_tasks and time.time() < deadline:
            grant = c.lease(node_id=worker, max_tasks=2, versions={"policy": 0})
            for lease in grant.leases:
                res = c.push(
                    node_id=worker, lease_id=lease.id, episodes=group(lease.task.id, [1, 0, 1])
                )
                assert res.accepted
                done_tasks.append(lease.task.id)
            if not grant.leases:
                c.heartbeat(worker)
                time.sleep(0.2)
        assert sorted(done_tasks) == sorted(set(done_tasks)) and len(done_tasks) == n_tasks
        assert {lease.task.id for lease in taken} <= set(done_tasks)
        # the silent node wakes up: its pushes are refused, nothing is taken twice
        late = c.push(
            node_id=silent, lease_id=taken[0].id, episodes=group(taken[0].task.id, [1, 1, 0])
        )
        assert not late.accepted and "first finisher" in late.reason
        assert set(c.heartbeat(silent, in_flight=[x.id for x in taken]).lost) == {
            x.id for x in taken
        }
        samples, task_ids = _drain_batches(c)
        assert len(samples) == n_tasks * group_size
        assert len({s.id for s in samples}) == len(samples)
        assert sorted(task_ids) == sorted(done_tasks)


TRAINER_SCRIPT = """
import os, sys
from astraflow.protocol.client import SyncDataflowClient
c = SyncDataflowClient(sys.argv[1], sys.argv[2], retries=0)
reply = c.next_batch(policy="policy", num_groups=2, trainer_version=0, trainer_id="t1")
print(reply.batch.id, ",".join(s.id for s in reply.batch.samples), flush=True)
os._exit(0)  # dies before acknowledging
"""


@pytest.mark.slow  # a trainer process dies and restarts
def test_trainer_dies_before_ack_batch_is_served_again(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"lease_timeout_s": 600.0})
    svc = ServiceProcess(recipe, tmp_path / "svc", tmp_path / "df.db")
    svc.start()
    try:
        with SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
            node = c.register(policies={"policy": 0}).node_id
            for lease in c.lease(node_id=node, max_tasks=4, versions={"policy": 0}).leases:
                c.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 0, 0, 1]))
        out = subprocess.run(
            [sys.executable, "-c", TRAINER_SCRIPT, svc.url, TOKEN],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        batch_id, sample_ids = out.stdout.split()
        svc.kill()
        svc.start()
        with SyncDataflowClient(svc.url, TOKEN, retries=0) as c:
            reply = c.next_batch(
                policy="policy", num_groups=2, trainer_version=0, trainer_id="t1-restarted"
            )
            assert reply.redelivered and reply.batch.id == batch_id
            assert ",".join(s.id for s in reply.batch.samples) == sample_ids
            c.ack(batch_id, trainer_version=1)
            nxt = c.next_batch(policy="policy", num_groups=2, trainer_version=1)
            assert nxt.batch.id != batch_id and not nxt.redelivered
    finally:
        svc.stop()
