"""A hostile node against saved episodes and leases (issue 48, findings 1, 3, 4 and 8's future
versions): the real dataflow service on loopback (uvicorn in a thread, a real SQLite store), a
manual clock so leases run out without the test sleeping, and raw bodies for what no honest
client sends.

What is pinned down:

- a save is bound to what the service issued for its lease: a finished episode reusing pushed
  ids, an env state for another task, tokens of a version never announced are refused (422
  naming the field) and counted in ``/status.refused``; nothing of them is stored;
- a push refused for what conflicts with what the service issued ends its lease at once (the
  task is leased again, heartbeats no longer renew it), discards the task's saved episodes, and
  is counted in ``/status.refused``;
- pushes claiming a version from the future are refused, not trained;
- heartbeats renew a lease only up to ``dataflow.lease_progress_s`` after its last push or
  save: a hoarded lease goes back to the queue and its node is throttled; a node holds at most
  ``dataflow.max_leases_per_node`` training leases;
- the launcher's stall check, fed the real ``/status``, names refused pushes as the cause.
"""

from __future__ import annotations

import pytest
from dataflow_helpers import TOKEN, ManualClock, ThreadedService, group, make_recipe
from hostile import NODE_TOKEN, Raw

from astraflow.dataflow.storage import history
from astraflow.launch.stall import StallWatch
from astraflow.protocol import PartialEpisode, Trajectory
from astraflow.protocol.client import RequestRejected, SyncDataflowClient
from astraflow.protocol.status import DataflowStatus

GROUP = 2


def _traj(version: int = 0) -> Trajectory:
    return Trajectory(
        role="agent",
        tokens=[1, 2, 3, 10, 11],
        loss_mask=[0, 0, 0, 1, 1],
        logprobs=[0.0, 0.0, 0.0, -0.5, -0.5],
        versions=[-1, -1, -1, version, version],
    )


def _save(index: int, payload: dict, version: int = 0) -> PartialEpisode:
    return PartialEpisode(
        index=index,
        turns=1,
        trajectories=[_traj(version)],
        env_state={"version": 1, "env": "MathMultiTurnEnv", "task": payload, "turn": 1},
        workflow_state={"turn_rewards": [0.0]},
    )


@pytest.fixture
def run(tmp_path):
    clock = ManualClock()
    recipe = make_recipe(
        tmp_path,
        tasks={"group_size": GROUP},
        dataflow={
            "lease_timeout_s": 5,
            "lease_progress_s": 12,
            "max_leases_per_node": 3,
            "buffer_steps": 0,
        },
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        client.announce_version(policy="policy", version=2, location="mem://2", digest="d2")
        yield svc, client, clock


def _node(client, name: str) -> str:
    return client.register(policies={"policy": 2}, name=name).node_id


def _lease(client, node: str, n: int = 1):
    return client.lease(node_id=node, max_tasks=n, versions={"policy": 2})


def _refused(client) -> dict[str, int]:
    return client.status()["refused"]


def _rejected(call) -> RequestRejected:
    with pytest.raises(RequestRejected) as err:
        call()
    assert err.value.status == 422, err.value
    return err.value


def test_a_save_reusing_pushed_episode_ids_is_refused_and_counted(run):
    """Finding 1: a node saved finished episodes under ids it had pushed already; every push of
    the honest node that resumed them was refused, for good. Such a save is refused at the door."""
    svc, client, _ = run
    evil = _node(client, "evil")
    first, second = _lease(client, evil, 2).leases
    pushed = group(first.task.id, [1.0, 0.0], version=2)
    assert client.push(node_id=evil, lease_id=first.id, episodes=pushed).accepted
    forged = pushed[0].model_copy(update={"task_id": second.task.id})
    err = _rejected(
        lambda: client.save_partials(
            node_id=evil,
            lease_id=second.id,
            partials=[PartialEpisode(index=0, turns=1, finished=forged)],
        )
    )
    assert err.fields == ["partials.0.finished.id"]
    assert "already pushed" in str(err) and pushed[0].id in str(err)
    assert svc.service.store.call(history.partials) == []
    assert _refused(client)["422 POST /partials: partials.*.finished.id"] == 1


def test_a_save_whose_env_state_is_for_another_task_is_refused(run):
    """Finding 3: a forged env state swapped the lease's question (and on the code env, its
    tests) for the attacker's; the state must be the lease's own task's."""
    svc, client, _ = run
    evil = _node(client, "evil")
    (lease,) = _lease(client, evil).leases
    other = {"question": "3+4", "answer": "7"}
    assert other != lease.task.payload
    err = _rejected(
        lambda: client.save_partials(node_id=evil, lease_id=lease.id, partials=[_save(0, other)])
    )
    assert err.fields == ["partials.0.env_state.task"]
    assert "not the task payload of lease" in str(err)
    assert svc.service.store.call(history.partials) == []
    assert _refused(client)["422 POST /partials: partials.*.env_state.task"] == 1
    # the lease's own payload is accepted
    ok = client.save_partials(
        node_id=evil, lease_id=lease.id, partials=[_save(0, lease.task.payload)]
    )
    assert ok.accepted and ok.stored == 1


def test_versions_from_the_future_are_refused_in_saves_and_pushes(run):
    """Finding 8: a push claiming a version 10^6 ahead was trained (never stale)."""
    svc, client, _ = run
    node = _node(client, "n")
    (lease,) = _lease(client, node).leases
    err = _rejected(
        lambda: client.save_partials(
            node_id=node,
            lease_id=lease.id,
            partials=[_save(0, lease.task.payload, version=1_000_000)],
        )
    )
    assert err.fields == ["partials.0.trajectories.0.versions"]
    assert "version 1000000" in str(err) and "newest version announced for it is 2" in str(err)
    err = _rejected(
        lambda: client.push(
            node_id=node,
            lease_id=lease.id,
            episodes=group(lease.task.id, [1.0, 0.0], version=1_000_000),
        )
    )
    assert err.fields == ["episodes.0.trajectories.0.versions"]
    assert svc.service.store.call(history.episodes) == []
    refused = _refused(client)
    assert refused["422 POST /trajectories: episodes.*.trajectories.*.versions"] == 1
    # refused at the door: the node may correct and resend on the same lease
    ok = client.push(
        node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1.0, 0.0], version=2)
    )
    assert ok.accepted


def test_a_refused_push_ends_its_lease_discards_the_saves_and_is_counted(run):
    """Finding 1: the honest node's refused pushes left its lease active (renewed by every
    heartbeat), the task cycled forever and /status.refused showed nothing."""
    svc, client, clock = run
    node = _node(client, "n")
    first, second = _lease(client, node, 2).leases
    pushed = group(first.task.id, [1.0, 0.0], version=2)
    assert client.push(node_id=node, lease_id=first.id, episodes=pushed).accepted
    saved = client.save_partials(
        node_id=node, lease_id=second.id, partials=[_save(1, second.task.payload)]
    )
    assert saved.accepted
    # episodes reusing pushed ids: refused, and the lease ends with it
    reused = [e.model_copy(update={"task_id": second.task.id}) for e in pushed]
    result = client.push(node_id=node, lease_id=second.id, episodes=reused)
    assert not result.accepted and "already pushed" in result.reason
    assert "ended, task back in the queue" in result.reason
    hb = client.heartbeat(node, in_flight=[second.id])
    assert second.id not in hb.renewed and second.id in hb.lost
    assert svc.service.store.call(history.partials) == []
    refused = _refused(client)
    assert refused["409 POST /trajectories: episodes.*.id"] == 1
    assert refused["discarded saved episodes: a push of their task's lease was refused"] == 1
    # the task is leased again at once (no deadline to wait out), and without the saves
    other = _node(client, "other")
    (again,) = _lease(client, other).leases
    assert again.task.id == second.task.id and again.partials == []
    fresh = group(second.task.id, [1.0, 0.0], version=2)
    assert client.push(node_id=other, lease_id=again.id, episodes=fresh).accepted


def test_heartbeats_do_not_keep_a_lease_that_makes_no_progress(run):
    """Finding 4: one lease kept alive by heartbeats froze the run past the lease timeout. It is
    renewed only up to lease_progress_s (12 s here) after its last push or save; then the task is
    leased again and the hoarding node is throttled."""
    svc, client, clock = run
    hoarder, worker = _node(client, "hoarder"), _node(client, "worker")
    (held,) = _lease(client, hoarder).leases
    (saving,) = _lease(client, worker).leases
    for _ in range(3):  # 12 s of heartbeats, 4 s apart (the lease timeout is 5 s)
        clock.advance(4)
        client.heartbeat(hoarder, in_flight=[held.id])
        client.heartbeat(worker, in_flight=[saving.id])
        # the worker saves a turn now and then: progress, so its lease is renewed on
        assert client.save_partials(
            node_id=worker, lease_id=saving.id, partials=[_save(0, saving.task.payload)]
        ).accepted
    clock.advance(4)
    hb = client.heartbeat(hoarder, in_flight=[held.id])
    assert held.id not in hb.renewed
    leases = {x.id: x.state for x in svc.service.store.call(history.leases)}
    assert leases[held.id] == "expired" and leases[saving.id] == "active"
    # the task goes to another node; the hoarder gets no training work while throttled
    third = _node(client, "third")
    assert held.task.id in [x.task.id for x in _lease(client, third, 3).leases]
    grant = _lease(client, hoarder)
    assert grant.leases == [] and "throttled" in grant.reason
    assert "lease_progress_s" in grant.reason and held.id in grant.reason
    clock.advance(13)  # the throttle lasts one bound
    assert len(_lease(client, hoarder).leases) == 1


def test_a_node_holds_at_most_its_lease_quota(run):
    """Finding 4: a node asking for everything took the whole task window."""
    _, client, _ = run
    greedy = _node(client, "greedy")
    grant = _lease(client, greedy, 50)
    assert len(grant.leases) == 3  # dataflow.max_leases_per_node
    again = _lease(client, greedy, 50)
    assert again.leases == [] and "max_leases_per_node = 3" in again.reason
    # another node is not held back by it
    assert len(_lease(client, _node(client, "fair"), 2).leases) == 2


def test_raw_forged_save_never_crashes_the_service(run):
    """Whatever the save carries, the answer is a 4xx naming the field, never a 500."""
    svc, client, _ = run
    node = _node(client, "n")
    (lease,) = _lease(client, node).leases
    raw = Raw(svc.url, NODE_TOKEN)
    try:
        for env_state in ({"task": None}, {"task": [1, {"a": float("1e308")}]}, {"task": "x"}):
            body = _save(0, lease.task.payload).model_dump(mode="json")
            body["env_state"] = env_state
            reply = raw.json(
                "POST", "/partials", {"node_id": node, "lease_id": lease.id, "partials": [body]}
            )
            assert reply.status_code == 422, reply.text
            assert "env_state.task" in reply.text
    finally:
        raw.close()
    assert svc.service.store.call(history.partials) == []


def test_the_stall_check_names_refused_pushes_as_the_cause(run):
    """Finding 1: with every push refused no episode is stored, and the stall check, which
    looked only at stored episodes, never fired. It reads /status.refused now."""
    _, client, _ = run
    watch = StallWatch(30.0)
    assert watch.check(DataflowStatus.model_validate(client.status()), now=0.0) is None
    node = _node(client, "n")
    for _ in range(3):
        (lease,) = _lease(client, node).leases
        wrong = group("task-not-this-one", [1.0, 0.0], version=2)
        assert not client.push(node_id=node, lease_id=lease.id, episodes=wrong).accepted
    st = DataflowStatus.model_validate(client.status())
    assert st.refused["409 POST /trajectories: episodes.*.task_id"] == 3
    assert watch.check(st, now=10.0) is None  # not stall_s yet
    stall = watch.check(st, now=31.0)
    assert stall is not None and stall.cause == "pushes_refused"
    assert "refused 3 push(es)" in stall.message
    assert "409 POST /trajectories: episodes.*.task_id: 3" in stall.message
