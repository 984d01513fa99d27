"""Staleness-aware admission on the real service (loopback HTTP, SQLite store, service clock).

The service leases training work only while groups in flight plus buffered stay within the
optimizer steps the trainer needs to stay busy (``ceil(group time / step time)``, measured
from leases, pushes, served batches and acks), never beyond ``buffer_steps`` or ``max_lag``
steps of groups; before anything is measured, one step's groups, so the first steps train fresh
samples. Each step's record in ``metrics.jsonl`` says what admission allowed and the batch's
version lag.
"""

from __future__ import annotations

import json

from dataflow_helpers import TOKEN, ManualClock, ThreadedService, group, make_recipe

from astraflow.dataflow.storage import metric_records
from astraflow.protocol.client import SyncDataflowClient

GROUPS_PER_STEP = 2


def _recipe(tmp_path, **dataflow):
    return make_recipe(
        tmp_path,
        policies={
            "policy": {
                "model": "builtin:tiny-arith",
                "trainer": {"groups_per_step": GROUPS_PER_STEP},
            }
        },
        run={"name": "t", "output_dir": str(tmp_path / "runs"), "max_steps": 50},
        dataflow={"lease_timeout_s": 600.0, "buffer_steps": 4, "max_lag": 3, **dataflow},
    )


def _lease(client, node):
    return client.lease(node_id=node, max_tasks=50, versions={"policy": 0})


def _push_all(client, node, leases, version=0):
    for lease in leases:
        episodes = group(lease.task.id, [1, 0, 1, 0], version=version)
        assert client.push(node_id=node, lease_id=lease.id, episodes=episodes).accepted


def _steps(svc) -> list[dict]:
    rows = svc.service.store.call(metric_records.all_in_order)
    return [r for r in (json.loads(b) for _, b in rows) if r["type"] == "step"]


def test_admission_holds_back_at_the_bound_and_follows_the_measured_pace(tmp_path):
    clock = ManualClock()
    recipe = _recipe(tmp_path)
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}, name="n").node_id
        # nothing measured yet: one step's groups, although buffer_steps allows four
        first = _lease(client, node).leases
        assert len(first) == GROUPS_PER_STEP
        held = _lease(client, node)
        assert held.leases == [] and "backpressure" in held.reason and "1 steps" in held.reason
        clock.advance(10.0)  # a group takes 10 s from lease to push
        _push_all(client, node, first)
        assert _lease(client, node).leases == []  # buffered groups count too
        # the trainer takes the batch: its groups leave the buffer and room opens at once
        batch = client.next_batch(policy="policy", num_groups=GROUPS_PER_STEP, trainer_version=0)
        second = _lease(client, node).leases
        assert len(second) == GROUPS_PER_STEP
        clock.advance(2.0)  # the step takes 2 s: 10 s groups need ceil(10 / 2) = 5 steps,
        client.ack(batch.batch.id, trainer_version=1)  # bounded by max_lag (3)
        third = _lease(client, node).leases
        assert len(third) == 3 * GROUPS_PER_STEP - len(second)
        assert _lease(client, node).leases == []

        (step,) = _steps(svc)
        assert step["admission"] == {"steps_ahead": 3, "cap_groups": 6, "step_s": 2.0,
                                     "group_s": 10.0}  # fmt: skip
        assert step["version_lag"] == {"mean": 0.0, "max": 0}  # v0 samples, trainer at v0
        assert step["dropped"] == {}


def test_a_trainer_faster_than_the_groups_keeps_one_step_in_flight(tmp_path):
    """Groups that come back within a step need one step of groups ahead, whatever
    buffer_steps allows: the samples a step trains were generated one version earlier."""
    clock = ManualClock()
    with (
        ThreadedService(_recipe(tmp_path), tmp_path / "df.db", config_kwargs={"clock": clock})
        as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):  # fmt: skip
        node = client.register(policies={"policy": 0}, name="n").node_id
        for version in range(3):
            leases = _lease(client, node).leases
            assert len(leases) == GROUPS_PER_STEP  # never more, step after step
            clock.advance(1.0)
            _push_all(client, node, leases, version=version)
            batch = client.next_batch(
                policy="policy", num_groups=GROUPS_PER_STEP, trainer_version=version
            ).batch
            clock.advance(5.0)
            client.ack(batch.id, trainer_version=version + 1)
        assert [s["admission"]["steps_ahead"] for s in _steps(svc)] == [1, 1, 1]
        assert [s["version_lag"]["max"] for s in _steps(svc)] == [0, 0, 0]


def test_buffer_admission_fills_buffer_steps_at_once(tmp_path):
    """``dataflow.admission = "buffer"``: buffer_steps steps of groups, whatever the pace (the
    stale warm-up the pace admission avoids)."""
    with (
        ThreadedService(_recipe(tmp_path, admission="buffer", max_lag=10), tmp_path / "df.db")
        as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):  # fmt: skip
        node = client.register(policies={"policy": 0}, name="n").node_id
        assert len(_lease(client, node).leases) == 4 * GROUPS_PER_STEP
