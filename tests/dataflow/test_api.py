"""Dataflow service semantics over real HTTP on loopback (uvicorn in a thread, real SQLite)."""

from __future__ import annotations

import json

import httpx
import msgpack
import pytest
from dataflow_helpers import TOKEN, ManualClock, ThreadedService, episode, group, make_recipe

from astraflow.dataflow import storage
from astraflow.dataflow.storage import history
from astraflow.protocol import TrajectoryPush
from astraflow.protocol.client import (
    AuthError,
    NotFoundError,
    RequestRejected,
    ServiceUnreachable,
    SyncDataflowClient,
)


@pytest.fixture
def service(tmp_path):
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        yield svc


@pytest.fixture
def client(service):
    with SyncDataflowClient(service.url, TOKEN, retries=0) as c:
        yield c


def _node(client, versions=None):
    return client.register(policies=versions or {"policy": 0}, name="n").node_id


def _finish(client, node, lease, rewards):
    return client.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, rewards))


def test_lease_push_batch_ack_round_trip(client, service):
    node = _node(client)
    grant = client.lease(node_id=node, max_tasks=2, versions={"policy": 0})
    assert len(grant.leases) == 2 and grant.leases[0].task.group_size == 4
    assert grant.leases[0].task.env == "astraflow/Math-v0"
    assert grant.leases[0].task.payload["question"]
    for lease in grant.leases:
        assert _finish(client, node, lease, [0, 1, 1, 0]).samples == 4
    reply = client.next_batch(policy="policy", num_groups=2, trainer_version=0)
    batch = reply.batch
    assert batch is not None and len(batch.groups) == 2 and len(batch.samples) == 8
    s = batch.samples[0]
    assert s.tokens == list(range(100, 112)) and s.loss_mask[:4] == [0, 0, 0, 0]
    assert s.logprobs[-1] == pytest.approx(-0.25)
    # GRPO advantages: (r - mean) / (std + 1e-4) with the unbiased std of [0,1,1,0]
    std = (4 * 0.25 / 3) ** 0.5
    assert s.advantage == pytest.approx((s.reward - 0.5) / (std + 1e-4))
    assert {g.reward_mean for g in batch.groups} == {0.5}
    ack = client.ack(batch.id, trainer_version=1, metrics={"loss": 0.25})
    assert ack.ok
    # acked samples keep their record but free their token arrays (the store stops growing)
    samples = service.service.store.call(history.samples)
    assert len(samples) == 8 and {s.stored_token_bytes for s in samples} == {0}
    status = client.status()
    assert status["policies"]["policy"]["steps"] == 1
    metrics = (service.service.config.metrics_path).read_text().splitlines()
    rec = json.loads(metrics[0])
    assert rec["type"] == "step" and rec["step"] == 1 and rec["version"] == 1
    assert rec["metrics"] == {"loss": 0.25} and rec["samples"] == 8 and rec["reward_mean"] == 0.5


def test_recipe_is_served_to_joining_nodes(client, service):
    recipe = client.recipe()
    assert recipe == service.service.config.recipe
    assert recipe.tasks.group_size == 4 and recipe.policies["policy"].trainer.groups_per_step == 2


def test_push_is_idempotent_and_first_finisher_wins(client):
    node_a, node_b = _node(client), _node(client)
    lease_a = client.lease(node_id=node_a, max_tasks=1, versions={"policy": 0}).leases[0]
    eps = group(lease_a.task.id, [1, 0, 1, 0])
    first = client.push(
        node_id=node_a, lease_id=lease_a.id, episodes=eps, idempotency_key="k-1234567"
    )
    again = client.push(
        node_id=node_a, lease_id=lease_a.id, episodes=eps, idempotency_key="k-1234567"
    )
    assert first.accepted and not first.duplicate
    assert again.accepted and again.duplicate and again.samples == first.samples
    # a different key for the same finished task is refused: never twice
    other = client.push(
        node_id=node_a, lease_id=lease_a.id, episodes=group(lease_a.task.id, [1] * 4)
    )
    assert not other.accepted and "already delivered" in other.reason
    assert client.status()["policies"]["policy"]["buffer_samples"] == 4
    # node B cannot push for A's lease
    bad = client.push(node_id=node_b, lease_id=lease_a.id, episodes=eps[:1])
    assert not bad.accepted and "granted to another node" in bad.reason


def test_push_validation_reasons(client):
    """Each refusal names what was wrong; one for what conflicts with the lease also ends it
    (issue 48: a refused lease no longer lingers, renewed by heartbeats), so each case here
    takes a fresh lease."""
    node = _node(client)

    def fresh():
        return client.lease(node_id=node, max_tasks=1, versions={"policy": 0}).leases[0]

    lease = fresh()
    too_many = client.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1] * 5))
    assert not too_many.accepted and "needs 4 more" in too_many.reason
    assert "ended, task back in the queue" in too_many.reason
    lease = fresh()
    wrong_task = client.push(node_id=node, lease_id=lease.id, episodes=group("other", [1]))
    assert not wrong_task.accepted and "task_id" in wrong_task.reason
    lease = fresh()
    bad_role = client.push(
        node_id=node, lease_id=lease.id, episodes=[episode(lease.task.id, roles=("critic",))]
    )
    assert not bad_role.accepted and "critic" in bad_role.reason
    lease = fresh()
    unknown = client.push(node_id=node, lease_id="lease-nope", episodes=group(lease.task.id, [1]))
    assert not unknown.accepted and "unknown lease" in unknown.reason
    # partial pushes complete the group (a refusal naming another lease left this one alone)
    assert client.push(
        node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 0])
    ).accepted
    assert client.status()["policies"]["policy"]["buffer_groups"] == 0
    assert client.push(
        node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 1])
    ).accepted
    assert client.status()["policies"]["policy"]["buffer_groups"] == 1


def test_an_episode_id_is_stored_once(client):
    """An episode id repeated inside one push, or already pushed under another key, is refused
    with the index of the first repeat; nothing of the refused push is stored, and the refusal
    ends the lease (its task is leased again, issue 48)."""
    node = _node(client)

    def lease_of(task_id=None):
        leases = client.lease(node_id=node, max_tasks=4, versions={"policy": 0}).leases
        return next(x for x in leases if task_id is None or x.task.id == task_id)

    lease = lease_of()
    first = group(lease.task.id, [1, 0])
    assert client.push(node_id=node, lease_id=lease.id, episodes=first).accepted
    twice = group(lease.task.id, [1])
    twice.append(twice[0].model_copy())
    inside = client.push(node_id=node, lease_id=lease.id, episodes=twice)
    assert not inside.accepted and "episodes[1].id" in inside.reason
    assert "ended, task back in the queue" in inside.reason
    lease = lease_of(lease.task.id)
    again = client.push(
        node_id=node, lease_id=lease.id, episodes=[*group(lease.task.id, [1]), first[1]]
    )
    assert not again.accepted and "episodes[1].id" in again.reason
    assert "already pushed" in again.reason
    # the refused pushes stored nothing: four fresh episodes on a new lease complete the group
    lease = lease_of(lease.task.id)
    done = client.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 0, 1, 0]))
    assert done.accepted
    assert client.status()["policies"]["policy"]["buffer_groups"] == 1


def test_error_episodes_counted_and_group_formed_from_rest(client):
    node = _node(client)
    lease = client.lease(node_id=node, max_tasks=1, versions={"policy": 0}).leases[0]
    eps = group(lease.task.id, [1, 0, 1]) + [episode(lease.task.id, error="env crashed")]
    assert client.push(node_id=node, lease_id=lease.id, episodes=eps).samples == 3
    st = client.status()["policies"]["policy"]
    assert st["buffer_groups"] == 1 and st["buffer_samples"] == 3
    assert st["dropped"] == {"episode_error": 1}


def test_env_timeout_episodes_counted_under_their_own_reason(client):
    """A node cuts an env call past rollout.env_timeout_s with finish_reason env_timeout; the
    drop is counted apart from crashes, so a limit that is too tight shows in status."""
    from astraflow.protocol import Episode

    node = _node(client)
    lease = client.lease(node_id=node, max_tasks=1, versions={"policy": 0}).leases[0]
    cut = Episode(
        task_id=lease.task.id,
        finish_reason="env_timeout",
        error="env.step took longer than rollout.env_timeout_s = 30s",
    )
    eps = group(lease.task.id, [1, 0]) + [cut, episode(lease.task.id, error="env crashed")]
    assert client.push(node_id=node, lease_id=lease.id, episodes=eps).samples == 2
    assert client.status()["policies"]["policy"]["dropped"] == {
        "episode_error": 1,
        "env_timeout": 1,
    }


def test_lease_expiry_and_late_push(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"lease_timeout_s": 0.3})
    clock = ManualClock()
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        a, b = _node(client), _node(client)
        lease_a = client.lease(node_id=a, max_tasks=1, versions={"policy": 0}).leases[0]
        clock.advance(0.8)  # A goes silent; its lease expires and the task is leased again
        leases_b = client.lease(node_id=b, max_tasks=70, versions={"policy": 0}).leases
        lease_b = next(lease for lease in leases_b if lease.task.id == lease_a.task.id)
        # A comes back late and finishes first: accepted (first finisher wins)
        assert _finish(client, a, lease_a, [1, 0, 0, 0]).accepted
        late_b = _finish(client, b, lease_b, [1, 1, 0, 0])
        assert not late_b.accepted and "first finisher" in late_b.reason
        hb = client.heartbeat(b, in_flight=[lease_b.id])
        assert hb.lost == [lease_b.id]
        assert client.status()["policies"]["policy"]["buffer_samples"] == 4


def test_heartbeat_renews_leases(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"lease_timeout_s": 0.6})
    clock = ManualClock()
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = _node(client)
        lease = client.lease(node_id=node, max_tasks=1, versions={"policy": 0}).leases[0]
        for _ in range(5):  # 1.25 s in all: twice the lease timeout, renewed every 0.25 s
            clock.advance(0.25)
            assert lease.id in client.heartbeat(node, in_flight=[lease.id]).renewed
        assert client.status()["expired_leases"] == 0
        assert _finish(client, node, lease, [1, 0, 1, 0]).accepted


def test_release_and_deregister_requeue(client):
    node = _node(client)
    leases = client.lease(node_id=node, max_tasks=3, versions={"policy": 0}).leases
    assert client.status()["in_flight_leases"] == 3
    client.release(node, [leases[0].id])
    assert client.status()["in_flight_leases"] == 2
    client.deregister(node)
    assert client.status()["in_flight_leases"] == 0
    other = _node(client)
    got = {
        lease.task.id
        for lease in client.lease(node_id=other, max_tasks=3, versions={"policy": 0}).leases
    }
    assert got == {lease.task.id for lease in leases}  # FIFO: the returned tasks go first
    with pytest.raises(NotFoundError, match="deregistered"):
        client.lease(node_id=node, max_tasks=1, versions={"policy": 0})


def test_lease_retry_with_same_key_gets_same_leases(client):
    node = _node(client)
    first = client.lease(node_id=node, max_tasks=2, versions={"policy": 0}, idempotency_key="lk-1")
    again = client.lease(node_id=node, max_tasks=2, versions={"policy": 0}, idempotency_key="lk-1")
    assert [lease.id for lease in first.leases] == [lease.id for lease in again.leases]
    assert client.status()["in_flight_leases"] == 2


def test_admission_control_and_weight_locations(client):
    node = _node(client)
    client.announce_version(policy="policy", version=6, location="http://w/6", digest="d6")
    grant = client.lease(node_id=node, max_tasks=2, versions={"policy": 1})
    assert grant.leases == [] and "admission control" in grant.reason
    assert "latest is 6" in grant.reason and grant.latest_versions == {"policy": 6}
    assert grant.weight_locations == {"policy": "http://w/6"}
    ok = client.lease(node_id=node, max_tasks=2, versions={"policy": 2})  # lag 4 == max_lag
    assert len(ok.leases) == 2
    missing = client.lease(node_id=node, max_tasks=1, versions={"other": 0})
    assert missing.leases == [] and "no weights for policies" in missing.reason
    hb = client.heartbeat(node, versions={"policy": 2})
    assert hb.latest_versions == {"policy": 6} and hb.weight_locations == {"policy": "http://w/6"}


def test_unacked_batch_is_served_again(client):
    node = _node(client)
    for lease in client.lease(node_id=node, max_tasks=4, versions={"policy": 0}).leases:
        _finish(client, node, lease, [1, 0, 0, 0])
    first = client.next_batch(policy="policy", num_groups=2, trainer_version=0)
    again = client.next_batch(policy="policy", num_groups=2, trainer_version=0, trainer_id="new")
    assert again.redelivered and again.batch.id == first.batch.id
    assert [s.id for s in again.batch.samples] == [s.id for s in first.batch.samples]
    client.ack(first.batch.id, trainer_version=1)
    nxt = client.next_batch(policy="policy", num_groups=2, trainer_version=1)
    assert not nxt.redelivered and nxt.batch.id != first.batch.id
    assert not {s.id for s in nxt.batch.samples} & {s.id for s in first.batch.samples}
    assert client.ack(first.batch.id, trainer_version=1).detail == "batch was already acknowledged"
    with pytest.raises(NotFoundError):
        client.ack("batch-unknown", trainer_version=1)


def test_long_poll_returns_when_groups_arrive(client):
    import threading
    import time

    node = _node(client)
    leases = client.lease(node_id=node, max_tasks=2, versions={"policy": 0}).leases

    def later():
        time.sleep(0.4)
        for lease in leases:
            _finish(client, node, lease, [1, 0, 0, 0])

    t = threading.Thread(target=later)
    t.start()
    start = time.time()
    reply = client.next_batch(policy="policy", num_groups=2, trainer_version=0, wait_s=20)
    t.join()
    assert reply.batch is not None and time.time() - start < 10
    empty = client.next_batch(policy="policy", num_groups=2, trainer_version=1, wait_s=0.2)
    assert empty.batch is None or empty.redelivered


def test_done_after_max_steps(tmp_path):
    recipe = make_recipe(
        tmp_path, run={"name": "t", "output_dir": str(tmp_path / "runs"), "max_steps": 1}
    )
    cfg_kwargs = {"done_grace_s": 0.0}
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs=cfg_kwargs) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = _node(client)
        for lease in client.lease(node_id=node, max_tasks=2, versions={"policy": 0}).leases:
            _finish(client, node, lease, [1, 0, 0, 0])
        batch = client.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
        # the final evaluation is requested before the last ack: nodes must run it before leaving
        client.announce_version(policy="policy", version=1, location="http://w/1", digest="d")
        client.request_evaluation(policy="policy", version=1, num_tasks=2)
        client.ack(batch.id, trainer_version=1)
        grant = client.lease(node_id=node, max_tasks=5, versions={"policy": 1})
        assert not grant.done and len(grant.leases) == 2
        assert all(lease.task.meta["eval"] for lease in grant.leases)
        assert not client.heartbeat(node).stop
        for lease in grant.leases:
            client.push(node_id=node, lease_id=lease.id, episodes=[episode(lease.task.id)])
        assert client.lease(node_id=node, max_tasks=1, versions={"policy": 1}).done
        assert client.heartbeat(node).stop
        assert client.next_batch(policy="policy", num_groups=2, trainer_version=1).done
        assert client.status()["done"]


def test_evaluation_flow(tmp_path):
    recipe = make_recipe(tmp_path)
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = _node(client)
        ev = client.request_evaluation(
            policy="policy", version=2, num_tasks=3, step=2, idempotency_key="ev-key-1"
        )
        again = client.request_evaluation(
            policy="policy", version=2, num_tasks=3, step=2, idempotency_key="ev-key-1"
        )
        assert again.id == ev.id and ev.num_tasks == 3 and ev.split == "test"
        old = client.lease(node_id=node, max_tasks=2, versions={"policy": 1})
        assert all(not lease.task.meta.get("eval") for lease in old.leases)
        new = client.lease(node_id=node, max_tasks=5, versions={"policy": 2})
        evals = [lease for lease in new.leases if lease.task.meta.get("eval")]
        assert len(evals) == 3 and new.leases[:3] == evals  # highest priority first
        assert evals[0].task.group_size == 1 and evals[0].task.meta["greedy"] is True
        assert evals[0].task.meta["min_version"] == 2 and evals[0].task.meta["eval_id"] == ev.id
        for lease, reward in zip(evals, [1.0, 0.0, 1.0], strict=True):
            client.push(
                node_id=node, lease_id=lease.id, episodes=[episode(lease.task.id, reward=reward)]
            )
        result = client.evaluation(ev.id)
        assert result.done and result.accuracy == pytest.approx(2 / 3) and result.completed == 3
        st = client.status()
        assert st["policies"]["policy"]["buffer_samples"] == 0  # no training samples
        records = [json.loads(x) for x in svc.service.config.metrics_path.read_text().splitlines()]
        assert records[-1]["type"] == "eval" and records[-1]["accuracy"] == pytest.approx(2 / 3)
        assert records[-1]["step"] == 2 and records[-1]["n"] == 3
        with pytest.raises(RequestRejected) as err:
            client.request_evaluation(policy="policy", version=1, task_set="nope")
        assert err.value.status == 422 and err.value.fields == ["task_set"]


def test_multi_role_and_frozen_policies(tmp_path):
    recipe = make_recipe(
        tmp_path,
        policies={
            "solver": {"model": "builtin:tiny-arith", "trainer": {"groups_per_step": 1}},
            "judge": {"model": "builtin:tiny-arith", "trainable": False},
        },
        workflow={"name": "debate", "roles": {"a": "solver", "b": "solver", "j": "judge"}},
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = client.register(policies={"solver": 0, "judge": 0}).node_id
        lease = client.lease(node_id=node, max_tasks=1, versions={"solver": 0, "judge": 0}).leases[
            0
        ]
        eps = [episode(lease.task.id, reward=float(i % 2), roles=("a", "b", "j")) for i in range(4)]
        res = client.push(node_id=node, lease_id=lease.id, episodes=eps)
        assert res.samples == 8  # 4 episodes x 2 solver roles; judge is frozen
        st = client.status()["policies"]
        assert st["solver"]["buffer_groups"] == 1 and st["solver"]["buffer_samples"] == 8
        assert st["judge"]["dropped"] == {"frozen_policy": 4}
        batch = client.next_batch(policy="solver", num_groups=1, trainer_version=0).batch
        assert {s.role for s in batch.samples} == {"a", "b"}
        with pytest.raises(RequestRejected, match="frozen"):
            client.next_batch(policy="judge", num_groups=1, trainer_version=0)


def test_lazy_enqueue_keeps_a_window(client, service):
    node = _node(client)
    client.lease(node_id=node, max_tasks=10, versions={"policy": 0})
    n_tasks = len(service.service.store.call(history.tasks))
    assert 10 <= n_tasks <= 10 + service.service.config.task_window  # not 20,000


def test_epochs_bound_and_exhaustion(tmp_path):
    recipe = make_recipe(
        tmp_path, tasks={"group_size": 1, "epochs": 2, "sets": [{"name": "arith", "limit": 3}]}
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = _node(client)
        grant = client.lease(node_id=node, max_tasks=50, versions={"policy": 0})
        ids = [lease.task.id for lease in grant.leases]
        assert len(ids) == 6 and len(set(ids)) == 6 and "exhausted" in grant.reason
        assert {i.split(":")[2] for i in ids} == {"e0", "e1"}


def test_json_bodies_and_replies(service):
    headers = {"authorization": f"Bearer {TOKEN}"}
    r = httpx.post(
        f"{service.url}/nodes/register", json={"policies": {"policy": 0}}, headers=headers
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    node = r.json()["node_id"]
    r = httpx.post(
        f"{service.url}/leases",
        json={"node_id": node, "max_tasks": 1, "versions": {"policy": 0}},
        headers={**headers, "accept": "application/msgpack"},
    )
    assert r.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(r.content)["leases"][0]["node_id"] == node


def test_packed_and_json_pushes_validate_alike(client, service):
    node = _node(client)
    lease = client.lease(node_id=node, max_tasks=1, versions={"policy": 0}).leases[0]
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/msgpack"}
    ep = episode(lease.task.id)
    body = TrajectoryPush(node_id=node, lease_id=lease.id, episodes=[ep]).model_dump(
        context={"packed": True}
    )
    body["episodes"][0]["trajectories"][0]["loss_mask"] = b"\x02\x00\x00\x00" * len(
        ep.trajectories[0].tokens
    )
    r = httpx.post(f"{service.url}/trajectories", content=msgpack.packb(body), headers=headers)
    assert r.status_code == 422
    reply = msgpack.unpackb(r.content)
    assert reply["fields"] == ["episodes.0.trajectories.0.loss_mask"]
    assert "only 0 and 1" in reply["detail"]
    body["episodes"][0]["trajectories"][0]["loss_mask"] = b"\x00\x00\x00\x00"
    r = httpx.post(f"{service.url}/trajectories", content=msgpack.packb(body), headers=headers)
    assert r.status_code == 422 and "must align" in msgpack.unpackb(r.content)["detail"]
    # the same push as JSON goes through FastAPI's route and lands the same way
    good = TrajectoryPush(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 0]))
    r = httpx.post(
        f"{service.url}/trajectories",
        content=good.model_dump_json(),
        headers={**headers, "content-type": "application/json"},
    )
    assert r.status_code == 200 and r.json()["samples"] == 2
    rest = group(lease.task.id, [1, 1])
    assert client.push(node_id=node, lease_id=lease.id, episodes=rest).samples == 2
    batch = client.next_batch(policy="policy", num_groups=1, trainer_version=0).batch
    assert sorted(s.reward for s in batch.samples) == [0, 1, 1, 1]
    assert all(s.tokens == list(range(100, 112)) for s in batch.samples)


def test_auth_size_and_validation_errors(service):
    url = service.url
    assert httpx.get(f"{url}/healthz").status_code == 200
    assert httpx.get(f"{url}/status").status_code == 401
    r = httpx.get(f"{url}/status", headers={"authorization": "Bearer nope"})
    assert r.status_code == 401 and "wrong run token" in r.json()["detail"]
    assert httpx.get(f"{url}/openapi.json").status_code == 401
    headers = {"authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{url}/openapi.json", headers=headers).json()["paths"]["/trajectories"]
    big = b"x" * (service.service.config.max_body_bytes + 1)
    r = httpx.post(
        f"{url}/trajectories",
        content=big,
        headers={**headers, "content-type": "application/msgpack"},
    )
    assert r.status_code == 413
    r = httpx.post(
        f"{url}/leases", json={"node_id": "n", "max_tasks": 0, "versions": {}}, headers=headers
    )
    assert r.status_code == 422 and r.json()["fields"] == ["max_tasks"]
    r = httpx.post(
        f"{url}/trajectories",
        content=b"\xc1garbage",
        headers={**headers, "content-type": "application/msgpack"},
    )
    assert r.status_code == 422 and r.headers["content-type"] == "application/msgpack"
    assert "not valid msgpack" in msgpack.unpackb(r.content)["detail"]
    with (
        SyncDataflowClient(url, "wrong", retries=0) as bad,
        pytest.raises(AuthError, match="wrong run token"),
    ):
        bad.status()


def test_client_reports_unreachable_service():
    with (
        SyncDataflowClient("http://127.0.0.1:9", TOKEN, retries=1, backoff_s=0.01) as c,
        pytest.raises(ServiceUnreachable, match="unreachable"),
    ):
        c.status()


def test_backpressure_caps_buffered_and_in_flight_groups(tmp_path):
    """Async mode leases no more training tasks than buffer_steps x groups_per_step allow."""
    recipe = make_recipe(
        tmp_path, dataflow={"lease_timeout_s": 30.0, "buffer_steps": 2, "admission": "buffer"}
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        node = _node(client)
        grant = client.lease(node_id=node, max_tasks=50, versions={"policy": 0})
        assert len(grant.leases) == 4  # 2 steps x 2 groups per step
        again = client.lease(node_id=node, max_tasks=50, versions={"policy": 0})
        assert again.leases == [] and "backpressure" in again.reason
        # releasing in-flight work makes room again
        client.release(node, [grant.leases[0].id])
        third = client.lease(node_id=node, max_tasks=50, versions={"policy": 0})
        assert len(third.leases) == 1


def test_a_stopping_service_writes_the_run_summary_to_metrics_jsonl(tmp_path):
    """What a finished run did is read from its metrics file (benchmarks never open the store):
    as it stops the service appends its status document and the run's clock figures."""
    svc = ThreadedService(make_recipe(tmp_path), tmp_path / "df.db")
    with svc, SyncDataflowClient(svc.url, TOKEN, retries=0) as client:
        node = _node(client)
        grant = client.lease(node_id=node, max_tasks=2, versions={"policy": 0})
        for lease in grant.leases:
            _finish(client, node, lease, [0, 1, 1, 0])
        batch = client.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
        client.ack(batch.id, trainer_version=1, metrics={})
    records = [json.loads(x) for x in svc.service.config.metrics_path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["step", "run_summary"]
    summary = records[-1]
    issued = min(lease.issued_at for lease in grant.leases)
    assert summary["first_lease_at"] == pytest.approx(issued)
    assert summary["train_episodes"] == 8
    [(served, done)] = summary["batches"]["policy"]
    assert served <= done == pytest.approx(records[0]["time"])
    assert summary["status"]["policies"]["policy"]["steps"] == 1
    assert summary["status"]["episodes"] == 8
    assert summary["acked"] == {"policy": [[1, batch.id]]}
    assert sorted(n for _, _, _, n in summary["leases"]) == [4, 4]
    assert summary["nodes"][node]["episodes"] == 8 and summary["nodes"][node]["name"] == "n"
    audit = summary["audit"]
    assert (audit["tasks_lost"], audit["tasks_duplicated"], audit["samples_trained_twice"]) == (
        0,
        0,
        0,
    )
    assert audit["leases_by_state"] == {"finished": 2}


def test_the_run_summary_audit_names_a_lost_and_a_twice_trained_task(tmp_path):
    """The audit is not a rubber stamp: a task left leased with no live lease and a group in two
    acknowledged batches (both forced into the store here) are reported by id."""
    svc = ThreadedService(make_recipe(tmp_path), tmp_path / "df.db")
    with svc, SyncDataflowClient(svc.url, TOKEN, retries=0) as client:
        node = _node(client)
        grant = client.lease(node_id=node, max_tasks=3, versions={"policy": 0})
        for lease in grant.leases[:2]:
            _finish(client, node, lease, [0, 1, 1, 0])
        batch = client.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
        client.ack(batch.id, trainer_version=1, metrics={})
        lost = grant.leases[2]

        def corrupt(tx):
            storage.leases.expire(tx, [lost.id])  # its task stays marked leased
            policy, version, layout, summary = storage.batches.for_assembly(tx, batch.id)
            storage.batches.insert(tx, ("copy", policy, "t", version, None, layout, summary, 0.0))
            storage.batches.mark_acked(tx, "copy", 0.0, step=2)  # the same groups again

        svc.service.store.call(corrupt)
    records = [json.loads(x) for x in svc.service.config.metrics_path.read_text().splitlines()]
    audit = records[-1]["audit"]
    assert audit["lost"]["orphaned"] == [lost.task.id] and audit["tasks_lost"] == 1
    assert sorted(audit["duplicated"]["group_in_two_batches"]) == sorted(g.id for g in batch.groups)
    assert audit["samples_trained_twice"] == 8 and audit["tasks_duplicated"] == 2


def test_per_turn_rewards_reach_the_trainer(client, service):
    """A trajectory's per-turn rewards (one per run of generated tokens) are stored with its
    sample and served in the batch, for trainer.turn_discount."""
    node = _node(client)
    for lease in client.lease(node_id=node, max_tasks=2, versions={"policy": 0}).leases:
        episodes = group(lease.task.id, [0, 1, 1, 0])
        for i, ep in enumerate(episodes):
            (traj,) = ep.trajectories
            traj.loss_mask = [0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1]  # two turns
            traj.turn_rewards = [0.5 * i, ep.rewards["agent"] - 0.5 * i]
        assert client.push(node_id=node, lease_id=lease.id, episodes=episodes).accepted
    batch = client.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
    kept = sorted(tuple(s.turn_rewards) for s in batch.samples)
    assert kept == sorted([(0.0, 0.0), (0.5, 0.5), (1.0, 0.0), (1.5, -1.5)] * 2)
