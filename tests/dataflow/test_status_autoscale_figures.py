"""The figures ``GET /status`` gives the autoscaler: a trainer's idle fraction (from the served
and acked times of its batches, on the service clock), the admission cap and the training groups
in flight. Real service on loopback, real store, a manual clock."""

from __future__ import annotations

from dataflow_helpers import TOKEN, ManualClock, ThreadedService, group, make_recipe

from astraflow.dataflow.ops.status import TRAINER_IDLE_WINDOW_S
from astraflow.protocol.client import SyncDataflowClient


def test_trainer_idle_cap_and_in_flight(tmp_path):
    clock = ManualClock()
    recipe = make_recipe(
        tmp_path,
        policies={"policy": {"model": "builtin:tiny-arith", "trainer": {"groups_per_step": 1}}},
        run={"name": "t", "output_dir": str(tmp_path / "runs"), "max_steps": 50},
        dataflow={"lease_timeout_s": 600.0, "buffer_steps": 4, "max_lag": 3},
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}, name="n").node_id
        st = client.status()
        assert st.policies["policy"].trainer_idle is None  # no batch yet: unknown, not idle
        assert st.policies["policy"].cap_groups == 1  # one step before anything is measured
        leases = client.lease(node_id=node, max_tasks=10, versions={"policy": 0}).leases
        assert client.status().training_in_flight == len(leases) == 1
        client.push(
            node_id=node, lease_id=leases[0].id, episodes=group(leases[0].task.id, [1, 0, 1, 0])
        )
        assert client.status().training_in_flight == 0

        batch = client.next_batch(policy="policy", num_groups=1, trainer_version=0)
        clock.advance(4.0)  # trains 4 s: busy all the time so far
        assert client.status().policies["policy"].trainer_idle == 0.0
        client.ack(batch.batch.id, trainer_version=1)
        clock.advance(4.0)  # then waits 4 s for data: idle half of the 8 s since its first batch
        assert client.status().policies["policy"].trainer_idle == 0.5
        clock.advance(TRAINER_IDLE_WINDOW_S)  # a whole window of waiting
        assert client.status().policies["policy"].trainer_idle == 1.0
