"""A restarted node that says it replaces a crashed one of its name frees that node's leases at
once, instead of after the lease timeout; a node of that name that is still alive is untouched."""

from __future__ import annotations

from collections import Counter

from dataflow_helpers import TOKEN, ManualClock, ThreadedService, make_recipe

from astraflow.dataflow.storage import history
from astraflow.protocol.client import SyncDataflowClient


def _active_by_node(svc) -> Counter[str]:
    return Counter(x.node_id for x in svc.service.store.call(history.leases) if x.state == "active")


def test_replace_frees_a_silent_namesakes_leases(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"lease_timeout_s": 600.0, "heartbeat_interval_s": 0.2})
    clock = ManualClock()
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as c,
    ):
        dead = c.register(name="node-1", policies={"policy": 0}).node_id
        held = c.lease(node_id=dead, max_tasks=3, versions={"policy": 0}).leases
        alive = c.register(name="node-2", policies={"policy": 0}).node_id
        c.lease(node_id=alive, max_tasks=2, versions={"policy": 0})

        # a replacement while node-1 is not yet silent for two heartbeats leaves it alone
        c.register(name="node-1", policies={"policy": 0}, replace=True)
        assert _active_by_node(svc).get(dead) == 3

        clock.advance(0.5)  # node-1 is now silent for more than two heartbeat intervals
        c.heartbeat(alive, versions={"policy": 0})
        c.register(name="node-1", policies={"policy": 0}, replace=True)
        states = _active_by_node(svc)
        assert dead not in states and states[alive] == 2
        pending = {t.id for t in svc.service.store.call(history.tasks) if t.state == "pending"}
        assert {lease.task.id for lease in held} <= pending
