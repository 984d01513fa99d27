"""The dataflow keeps a bounded sample of finished episodes per step, served at GET /transcripts
(admin only), and status names failed episodes by reason with their first message."""

from __future__ import annotations

from contextlib import contextmanager

import httpx
import pytest
from dataflow_helpers import TOKEN, ThreadedService, episode, group, make_recipe

from astraflow.launch.transcripts import Decoders, read_store
from astraflow.protocol.auth import derive_token
from astraflow.protocol.client import SyncDataflowClient


@contextmanager
def service(tmp_path, per_step: int, tasks: int, **sections):
    """A service keeping ``per_step`` transcripts, a node and ``tasks`` leases of it."""
    recipe = make_recipe(tmp_path, logging={"transcripts_per_step": per_step}, **sections)
    with (
        ThreadedService(recipe, tmp_path / "dataflow.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"policy": 0}, name="n").node_id
        leases = client.lease(node_id=node, max_tasks=tasks, versions={"policy": 0}).leases
        yield recipe, svc, client, node, leases


def test_per_step_bound_failed_apart_advantages_and_errors(tmp_path):
    with service(tmp_path, 2, 4) as (recipe, svc, client, node, leases):
        pushes = [
            group(leases[0].task.id, [1, 0, 1, 0]),
            group(leases[1].task.id, [1, 1, 0, 0], version=1),
            group(leases[2].task.id, [0, 0, 0, 1]),
            [episode(leases[3].task.id, error=f"ValueError: bad answer {i}") for i in range(4)],
        ]
        for lease, episodes in zip(leases, pushes, strict=True):
            client.push(node_id=node, lease_id=lease.id, episodes=episodes)

        kept = client.transcripts().transcripts
        # two per (step, failed): v1 has 2, v0 has 2 (of 8 pushed), failed ones apart: 2
        assert sorted((t.step, t.failed) for t in kept) == [(0, False), (0, False),
                                                            (1, False), (1, False),
                                                            (1, True), (1, True)]  # fmt: skip
        assert kept[0].step == 1  # newest step first
        good = next(t for t in kept if not t.failed)
        (traj,) = good.trajectories
        assert traj.role == "agent" and traj.loss_mask == [0] * 4 + [1] * 8
        assert traj.versions[4:] == [good.step] * 8 and traj.logprobs[-1] == pytest.approx(-0.25)
        assert good.policy == {"agent": "policy"} and set(good.advantages) == {"agent"}
        assert abs(good.advantages["agent"]) > 0.5  # a 1 or 0 in a group of mean 0.5
        failed = client.transcripts(failed=True).transcripts
        assert len(failed) == 2 and failed[0].error.startswith("ValueError: bad answer")
        assert [t.step for t in client.transcripts(step=0).transcripts] == [0, 0]

        st = client.status()
        assert st.errors["episode_error"].count == 4
        assert st.errors["episode_error"].first == "ValueError: bad answer 0"
        assert st.errors["episode_error"].last == "ValueError: bad answer 3"

        # admin only: a node token may not read what other nodes produced
        node_token = derive_token(TOKEN, "node")
        reply = httpx.get(
            f"{svc.url}/transcripts", headers={"authorization": f"Bearer {node_token}"}
        )
        assert reply.status_code == 403

    # the same records from the run's store on disk, decoded with the recipe's tokenizer
    on_disk = read_store(tmp_path, limit=50)
    assert len(on_disk) == 6
    decoded = Decoders(recipe).decode(on_disk[0])
    assert [t.source for t in decoded.turns] == ["context", "policy"]
    assert decoded.turns[1].tokens == 8 and decoded.turns[1].versions == [on_disk[0].step]


def test_zero_keeps_none(tmp_path):
    with service(tmp_path, 0, 1) as (_, _, client, node, (lease,)):
        client.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 0, 1, 0]))
        assert client.transcripts().transcripts == []


def test_a_step_past_64_bits_is_refused_with_422_not_a_server_error(tmp_path):
    """SQLite cannot bind an integer past 64 bits: the query parameter is bounded at the door
    (schemathesis found GET /transcripts?step=<huge> answered 500)."""
    with service(tmp_path, 2, 1) as (_, svc, *_rest):
        auth = {"authorization": f"Bearer {TOKEN}"}
        for step in (2**63, 2**70, -1):
            r = httpx.get(f"{svc.url}/transcripts", params={"step": step}, headers=auth)
            assert r.status_code == 422, (step, r.status_code, r.text[:200])
            assert "step" in r.text
        ok = httpx.get(f"{svc.url}/transcripts", params={"step": 2**63 - 1}, headers=auth)
        assert ok.status_code == 200, ok.text[:200]


def test_each_kept_episode_says_whether_it_was_trained_and_why_not(tmp_path):
    """An episode the trainer never saw must not read as one it learned from (found: `transcripts
    --step 100` showed only a zero-variance group the filter dropped, without saying so)."""
    from astraflow.cli.main import app
    from typer.testing import CliRunner

    zero_variance = {"policies": [{"name": "zero_variance_filter"}]}
    with service(tmp_path, 10, 4, dataflow=zero_variance) as (_, _svc, client, node, leases):
        pushes = [
            group(leases[0].task.id, [1, 0, 1, 0]),  # trained in step 1
            group(leases[1].task.id, [1, 1, 1, 1]),  # zero variance: filtered
            group(leases[2].task.id, [0, 1, 0, 0]),  # buffered
            [episode(leases[3].task.id, error="ValueError: no") for _ in range(4)],
        ]
        for lease, episodes in zip(leases, pushes, strict=True):
            client.push(node_id=node, lease_id=lease.id, episodes=episodes)
        batch = client.next_batch(policy="policy", num_groups=1, trainer_version=0).batch
        client.ack(batch.id, trainer_version=1)
        by_task = {}
        for t in client.transcripts(limit=50).transcripts:
            (fate,) = t.fates.values()
            by_task.setdefault(t.task_id, set()).add((fate, t.trained))
        trained_task = {s.task_id for s in batch.samples}.pop()
        assert by_task.pop(trained_task) == {("trained", True)}
        assert by_task.pop(leases[1].task.id) == {("filtered", False)}
        assert by_task.pop(leases[3].task.id) == {("failed", False)}
        assert list(by_task.values()) == [{("buffered", False)}]
        steps = {
            t.trained_steps["agent"] for t in client.transcripts(limit=50).transcripts if t.trained
        }
        assert steps == {1}

    runner = CliRunner()
    every = runner.invoke(app, ["transcripts", str(tmp_path), "--limit", "50"])
    assert every.exit_code == 0, every.output
    assert "trained in step 1" in every.output and "filtered out" in every.output
    assert "failed (an error)" in every.output and "not trained yet" in every.output
    only = runner.invoke(app, ["transcripts", str(tmp_path), "--trained", "--json"])
    assert only.exit_code == 0, only.output
    import json

    kept = json.loads(only.output)
    assert kept and {t["record"]["fates"]["agent"] for t in kept} == {"trained"}
