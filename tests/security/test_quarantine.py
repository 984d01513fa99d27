"""A bad batch never kills a run: samples a trainer refuses are quarantined and counted, and a
batch its trainer failed on twice is set aside instead of being served a third time."""

from __future__ import annotations

import json

from dataflow_helpers import ThreadedService, group, make_recipe
from hostile import NODE_TOKEN, TRAINER_TOKEN

from astraflow.dataflow.ops.batching import QUARANTINE_AFTER_SERVES
from astraflow.protocol.client import SyncDataflowClient


def _fill(url: str, groups: int, name: str = "box") -> str:
    """Register a node and push ``groups`` complete groups; returns the node id."""
    with SyncDataflowClient(url, NODE_TOKEN, retries=0) as node:
        nid = node.register(policies={"policy": 0}, name=name).node_id
        leases = node.lease(node_id=nid, max_tasks=groups, versions={"policy": 0}).leases
        for i, lease in enumerate(leases):
            rewards = [float((i + k) % 2) for k in range(4)]
            assert node.push(
                node_id=nid, lease_id=lease.id, episodes=group(lease.task.id, rewards)
            ).accepted
    return nid


def _records(recipe, kind: str) -> list[dict]:
    lines = (recipe.run.run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, filter(None, lines)) if r.get("type") == kind]


def test_samples_a_trainer_refuses_are_counted_and_their_node_named(tmp_path):
    recipe = make_recipe(tmp_path)
    with ThreadedService(recipe, tmp_path / "df.db") as svc:
        nid = _fill(svc.url, 2, name="poisoner")
        with SyncDataflowClient(svc.url, TRAINER_TOKEN, retries=0) as trainer:
            batch = trainer.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
            bad = batch.samples[0].id
            trainer.ack(
                batch.id,
                trainer_version=1,
                invalid_samples={bad: "token ids outside the vocabulary", "smp-not-mine": "x"},
            )
            st = trainer.status()
        assert st.policies["policy"].dropped["invalid_sample"] == 1
        assert st.policies["policy"].steps == 1  # the step trained on the rest
        node = next(n for n in st.nodes if n.id == nid)
        assert node.metrics["invalid_samples"] == 1.0
    (record,) = _records(recipe, "quarantine")
    assert record["samples"] == {
        bad: {"node": f"poisoner ({nid})", "why": "token ids outside the vocabulary"}
    }


def test_a_batch_served_twice_without_ack_is_quarantined(tmp_path):
    recipe = make_recipe(tmp_path)
    with ThreadedService(recipe, tmp_path / "df.db") as svc:
        _fill(svc.url, 4)
        with SyncDataflowClient(svc.url, TRAINER_TOKEN, retries=0) as trainer:
            first = trainer.next_batch(policy="policy", num_groups=2, trainer_version=0)
            for _ in range(QUARANTINE_AFTER_SERVES - 1):  # the trainer died on it each time
                again = trainer.next_batch(policy="policy", num_groups=2, trainer_version=0)
                assert again.redelivered and again.batch.id == first.batch.id
            fresh = trainer.next_batch(policy="policy", num_groups=2, trainer_version=0)
            assert fresh.batch is not None and fresh.batch.id != first.batch.id
            assert not fresh.redelivered
            trainer.ack(fresh.batch.id, trainer_version=1)
            st = trainer.status()
        assert st.policies["policy"].dropped["quarantined_batch"] == len(first.batch.samples)
        assert st.policies["policy"].steps == 1
    (record,) = _records(recipe, "quarantine")
    assert record["batch_id"] == first.batch.id and record["samples"] == len(first.batch.samples)
