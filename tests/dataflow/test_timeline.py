"""A trainer restarting from an older checkpoint rewinds its policy: same batches, same order,
exact step count, no evaluation or step record of the discarded versions left behind."""

from __future__ import annotations

import json

import pytest
from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe

from astraflow.dataflow.storage import history
from astraflow.protocol import WeightVersion
from astraflow.protocol.client import SyncDataflowClient


@pytest.fixture()
def service(tmp_path):
    recipe = make_recipe(
        tmp_path,
        run={"name": "t", "output_dir": str(tmp_path / "runs"), "max_steps": 6},
        evaluation={"every_steps": 0, "num_tasks": 4, "split": "test"},
    )
    with ThreadedService(recipe, tmp_path / "df.db") as svc:
        yield svc


def _announce(c, version: int):
    return c.announce_version(
        WeightVersion(policy="policy", version=version, location="/w", digest=f"d{version}")
    )


def _fill(c, node: str, tasks: int) -> None:
    for lease in c.lease(node_id=node, max_tasks=tasks, versions={"policy": 0}).leases:
        c.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 0, 0, 1]))


def _step(c, version: int, checkpoint: int) -> tuple[str, list[str], list[int]]:
    """Pull the next batch as a trainer at ``version`` and ack it as step ``version + 1``."""
    batch = c.next_batch(policy="policy", num_groups=2, trainer_version=version).batch
    assert batch is not None
    ids = [s.id for s in batch.samples]
    tokens = batch.samples[0].tokens
    c.ack(batch.id, trainer_version=version + 1, checkpoint_version=checkpoint)
    _announce(c, version + 1)
    return batch.id, ids, tokens


def _steps(svc) -> list[tuple[int, str]]:
    """(step, batch id) of the acknowledged batches, by step."""
    return sorted(
        (b.step, b.id) for b in svc.service.store.call(history.batches) if b.state == "acked"
    )


def _records(svc, kind: str) -> list[dict]:
    lines = svc.service.config.metrics_path.read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == kind]


def test_rewind_replays_the_same_batches_in_order(service):
    with SyncDataflowClient(service.url, TOKEN, retries=0) as c:
        node = c.register(policies={"policy": 0}).node_id
        _fill(c, node, 12)
        _announce(c, 0)
        # steps 1-5; the trainer checkpoints at steps 2 and 4
        first = [_step(c, v, checkpoint=2 * ((v + 1) // 2)) for v in range(5)]
        ev = c.request_evaluation(policy="policy", version=5, idempotency_key="eval-policy-v5")
        assert [r["step"] for r in _records(service, "step")] == [1, 2, 3, 4, 5]

        # the trainer dies and restarts from checkpoint-4: versions 5.. no longer exist
        ack = _announce(c, 4)
        assert "1 later step(s) will be trained again" in ack.detail
        assert [s for s, _ in _steps(service)] == [1, 2, 3, 4]
        assert c.status()["policies"]["policy"]["steps"] == 4
        assert [r["step"] for r in _records(service, "step")] == [1, 2, 3, 4]
        # the evaluation of the discarded v5 is gone; asking again makes a new one
        assert ev.id not in {e.id for e in c.evaluations()}
        again = c.request_evaluation(policy="policy", version=5, idempotency_key="eval-policy-v5")
        assert again.id != ev.id

        # step 5 is served again: the same batch, the same samples, token arrays intact
        batch_id, ids, tokens = _step(c, 4, checkpoint=4)
        assert (batch_id, ids, tokens) == first[4]
        assert [s for s, _ in _steps(service)] == [1, 2, 3, 4, 5]
        assert [r["step"] for r in _records(service, "step")] == [1, 2, 3, 4, 5]
        # and step 6 is a new batch; then the run is complete at exactly max_steps
        sixth, _, _ = _step(c, 5, checkpoint=4)
        assert sixth not in {b for b, _, _ in first}
        assert c.next_batch(policy="policy", num_groups=2, trainer_version=6).done
        assert [r["version"] for r in _records(service, "step")] == [1, 2, 3, 4, 5, 6]


def test_a_replayed_batch_is_quarantined_only_for_failures_after_its_rewind(service):
    """A rewound batch had been trained and acknowledged: its earlier serves were no failures. A
    trainer killed from outside once while replaying it gets it again (found in the slow tier: a
    step trained, rewound, then killed once was set aside and the final timeline lost it)."""
    with SyncDataflowClient(service.url, TOKEN, retries=0) as c:
        node = c.register(policies={"policy": 0}).node_id
        _fill(c, node, 12)
        _announce(c, 0)
        first = [_step(c, v, checkpoint=2) for v in range(3)]
        _announce(c, 2)  # restarted from checkpoint-2: step 3 is replayed
        replay = c.next_batch(policy="policy", num_groups=2, trainer_version=2)
        assert replay.redelivered and replay.batch.id == first[2][0]
        # the trainer is killed while replaying it, restarts, and asks again: the same batch
        again = c.next_batch(policy="policy", num_groups=2, trainer_version=2)
        assert again.redelivered and again.batch.id == first[2][0]
        assert c.status()["policies"]["policy"]["dropped"].get("quarantined_batch", 0) == 0
        # a second failure on it after the rewind is one too many: set aside
        fresh = c.next_batch(policy="policy", num_groups=2, trainer_version=2)
        assert fresh.batch.id != first[2][0] and not fresh.redelivered
        assert c.status()["policies"]["policy"]["dropped"]["quarantined_batch"] > 0


def test_rewind_past_a_freed_checkpoint_retrains_on_fresh_groups(service):
    with SyncDataflowClient(service.url, TOKEN, retries=0) as c:
        node = c.register(policies={"policy": 0}).node_id
        _fill(c, node, 14)
        _announce(c, 0)
        first = [_step(c, v, checkpoint=2 * ((v + 1) // 2)) for v in range(5)]
        # samples of steps covered by checkpoint-4 were freed; steps after it were kept
        step_of = {b.id: b.step for b in service.service.store.call(history.batches)}
        sizes: dict[int, int] = {}  # step -> the smallest token array still stored
        for s in service.service.store.call(history.samples):
            if s.batch_id is not None:
                step = step_of[s.batch_id]
                sizes[step] = min(sizes.get(step, s.stored_token_bytes), s.stored_token_bytes)
        assert {step: n > 0 for step, n in sizes.items()} == {
            1: False,
            2: False,
            3: False,
            4: False,
            5: True,
        }
        # restarting from checkpoint-2 (checkpoint-4 lost): steps 3-4 cannot be replayed
        _announce(c, 2)
        assert c.status()["policies"]["policy"]["steps"] == 2
        drops = c.status()["policies"]["policy"]["dropped"]
        assert drops["rewound_steps"] == 3
        third = _step(c, 2, checkpoint=2)
        assert third == first[4]  # the one replayable batch comes first
        fourth, _, _ = _step(c, 3, checkpoint=2)
        assert fourth not in {b for b, _, _ in first}
        assert [s for s, _ in _steps(service)] == [1, 2, 3, 4]


def test_a_batch_consumed_without_a_step_is_not_a_step(service):
    with SyncDataflowClient(service.url, TOKEN, retries=0) as c:
        node = c.register(policies={"policy": 0}).node_id
        _fill(c, node, 4)
        batch = c.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
        c.ack(batch.id, trainer_version=0, trained=False, metrics={"skipped_batch": 1.0})
        assert c.status()["policies"]["policy"]["steps"] == 0
        nxt = c.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
        assert nxt.id != batch.id
        assert c.ack(nxt.id, trainer_version=1).detail == "step 1 of 'policy' recorded"


def test_reannounced_version_keeps_its_evaluations_only_with_the_same_weights(service):
    with SyncDataflowClient(service.url, TOKEN, retries=0) as c:
        _announce(c, 0)
        _announce(c, 1)
        ev = c.request_evaluation(policy="policy", version=1, idempotency_key="eval-policy-v1")
        _announce(c, 1)  # the same weights again (a trainer resumed from checkpoint-1)
        assert ev.id in {e.id for e in c.evaluations()}
        c.announce_version(WeightVersion(policy="policy", version=1, location="/w", digest="other"))
        assert ev.id not in {e.id for e in c.evaluations()}
