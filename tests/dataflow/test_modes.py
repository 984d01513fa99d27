"""Dataflow policies and the sync baseline, through the real service over loopback HTTP."""

from __future__ import annotations

from collections import Counter

import pytest
from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe

from astraflow.protocol.client import SyncDataflowClient


def _serve(tmp_path, **sections):
    return ThreadedService(make_recipe(tmp_path, **sections), tmp_path / "df.db")


def _fill(client, node, n, rewards, version=0):
    for lease in client.lease(node_id=node, max_tasks=n, versions={"policy": version}).leases:
        client.push(
            node_id=node, lease_id=lease.id, episodes=group(lease.task.id, rewards, version=version)
        )


def test_zero_variance_groups_are_dropped_and_counted(tmp_path):
    with (
        _serve(tmp_path, dataflow={"policies": [{"name": "zero_variance_filter"}]}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}).node_id
        _fill(client, node, 3, [1, 1, 1, 1])
        _fill(client, node, 2, [1, 0, 1, 1])
        st = client.status()["policies"]["policy"]
        assert st["buffer_groups"] == 2 and st["dropped"] == {"zero_variance": 12}


@pytest.mark.parametrize("action", ["drop", "weight"])
def test_staleness_bound_at_batch_time(tmp_path, action):
    policies = [{"name": "staleness", "kwargs": {"max_staleness": 1, "action": action}}]
    with (
        _serve(tmp_path, dataflow={"policies": policies, "max_lag": 10}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}).node_id
        _fill(client, node, 2, [1, 0, 0, 0], version=0)
        _fill(client, node, 2, [1, 0, 0, 0], version=2)
        reply = client.next_batch(policy="policy", num_groups=2, trainer_version=3)
        if action == "drop":
            # the two version-0 groups are 3 versions old: dropped for good, counted
            assert {min(s.versions[4:]) for s in reply.batch.samples} == {2}
            assert client.status()["policies"]["policy"]["dropped"] == {"stale": 8}
            assert reply.batch.dropped == {"stale": 8}
        else:
            weights = Counter(round(s.weight, 3) for s in reply.batch.samples)
            assert weights == {0.25: 8}  # FIFO: the old groups first, weight 0.5**(3-1)
            client.ack(reply.batch.id, trainer_version=4)
            assert client.status()["policies"]["policy"]["staleness"] == {"3": 8}


def test_mixing_ratio_across_task_sets(tmp_path):
    sets = [
        {"name": "arith", "weight": 3, "kwargs": {"level": 2}},
        {"name": "arith", "weight": 1, "kwargs": {"level": 3}},
    ]
    with (
        _serve(tmp_path, tasks={"group_size": 1, "sets": sets}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}).node_id
        leases = client.lease(node_id=node, max_tasks=40, versions={"policy": 0}).leases
        by_set = Counter(lease.task.task_set for lease in leases)
        assert by_set == {"arith[0]": 30, "arith[1]": 10}
        levels = {lease.task.task_set: lease.task.payload["level"] for lease in leases}
        assert levels == {"arith[0]": 2, "arith[1]": 3}


def test_mixing_policy_overrides_recipe_weights(tmp_path):
    sets = [{"name": "arith", "kwargs": {"level": 2}}, {"name": "arith", "kwargs": {"level": 3}}]
    policies = [{"name": "mixing", "kwargs": {"weights": {"arith[0]": 1, "arith[1]": 4}}}]
    with (
        _serve(
            tmp_path, tasks={"group_size": 1, "sets": sets}, dataflow={"policies": policies}
        ) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}).node_id
        leases = client.lease(node_id=node, max_tasks=50, versions={"policy": 0}).leases
        assert Counter(lease.task.task_set for lease in leases) == {"arith[0]": 10, "arith[1]": 40}


def test_sync_mode_runs_in_lock_step_rounds(tmp_path):
    with (
        _serve(
            tmp_path,
            run={"name": "s", "output_dir": str(tmp_path / "runs"), "mode": "sync", "max_steps": 3},
            tasks={"group_size": 2},
        ) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}).node_id
        grant = client.lease(node_id=node, max_tasks=10, versions={"policy": 0})
        assert len(grant.leases) == 2 and "round 0" in grant.reason  # groups_per_step = 2
        first, second = grant.leases
        client.push(node_id=node, lease_id=first.id, episodes=group(first.task.id, [1, 0]))
        waiting = client.next_batch(policy="policy", num_groups=2, trainer_version=0)
        assert waiting.batch is None  # the round is not complete yet
        client.push(node_id=node, lease_id=second.id, episodes=group(second.task.id, [1, 0]))
        batch = client.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
        assert len(batch.groups) == 2
        client.ack(batch.id, trainer_version=1)
        # acked, but version 1 not announced yet: round 1 has not started
        assert client.lease(node_id=node, max_tasks=2, versions={"policy": 1}).leases == []
        assert client.next_batch(policy="policy", num_groups=2, trainer_version=1).batch is None
        client.announce_version(policy="policy", version=1, location="http://w/1", digest="d")
        stale = client.lease(node_id=node, max_tasks=2, versions={"policy": 0})
        assert stale.leases == [] and "version 1" in stale.reason
        fresh = client.lease(node_id=node, max_tasks=5, versions={"policy": 1})
        assert len(fresh.leases) == 2
        assert client.status()["round"] == 1
