"""``POST /partials``: a node saves episodes still in flight; the task's next lease carries them.

A real service on loopback (uvicorn in a thread, a real SQLite store) and a manual clock, so a
lease expires without the test sleeping. What is checked: every value of a save is validated at
the door (roles, episode index, token ids against the policy's vocabulary, token arrays), only
the node holding an active lease of the task may save, the task's next lease carries exactly what
was saved (tokens, log-probs, versions, env state), a newer save replaces the older one, and the
saves are gone once the task completes. The store is read through ``storage.history``.
"""

from __future__ import annotations

import httpx
import pytest
from dataflow_helpers import TOKEN, ManualClock, ThreadedService, group, make_recipe

from astraflow.dataflow.storage import history
from astraflow.protocol import PartialEpisode, Trajectory
from astraflow.protocol.client import RequestRejected, SyncDataflowClient

GROUP = 4


def _traj(turns: int, version: int, role: str = "agent") -> Trajectory:
    """A prompt of 3 tokens, then ``turns`` turns of 2 generated + 1 feedback token."""
    tokens, mask, lps, vers = [1, 2, 3], [0, 0, 0], [0.0] * 3, [-1] * 3
    for t in range(turns):
        tokens += [10 + t, 20 + t, 30 + t]
        mask += [1, 1, 0]
        lps += [-0.5 - t, -0.25 - t, 0.0]
        vers += [version, version, -1]
    return Trajectory(role=role, tokens=tokens, loss_mask=mask, logprobs=lps, versions=vers)


def _partial(
    index: int, turns: int, version: int = 3, task: dict | None = None, **kw
) -> PartialEpisode:
    """``task``: the payload the env state names (a save's must be its lease's own task's)."""
    return PartialEpisode(
        index=index,
        turns=turns,
        trajectories=[_traj(turns, version, **kw)],
        env_state={"task": task if task is not None else {"question": "2+3"}, "turn": turns},
        workflow_state={"turn_rewards": [0.0] * turns},
        elapsed_s=1.5,
    )


@pytest.fixture
def run(tmp_path):
    clock = ManualClock()
    recipe = make_recipe(tmp_path, tasks={"group_size": GROUP}, dataflow={"lease_timeout_s": 5})
    with (
        ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        yield svc, client, clock


def _node(client, name):
    return client.register(policies={"policy": 0}, name=name).node_id


def _saved(svc):
    return svc.service.store.call(history.partials)


def test_expired_lease_hands_its_saved_episodes_to_the_next_lease(run):
    svc, client, clock = run
    a, b = _node(client, "A"), _node(client, "B")
    (lease_a,) = client.lease(node_id=a, max_tasks=1, versions={"policy": 0}).leases
    assert lease_a.partials == []  # nothing saved yet
    task = lease_a.task.payload  # a save's env state is the state of its lease's task
    first = client.save_partials(
        node_id=a, lease_id=lease_a.id, partials=[_partial(0, 1, task=task)]
    )
    assert first.accepted and first.stored == 1
    # a newer save of episode 0 replaces the older one; episode 2 is saved beside it
    newer = client.save_partials(
        node_id=a,
        lease_id=lease_a.id,
        partials=[_partial(0, 2, task=task), _partial(2, 1, task=task)],
    )
    assert newer.accepted and newer.stored == 2
    rows = _saved(svc)
    assert [(r.task_id, r.index, r.turns, r.lease_id) for r in rows] == [
        (lease_a.task.id, 0, 2, lease_a.id),
        (lease_a.task.id, 2, 1, lease_a.id),
    ]

    clock.advance(6)  # A goes silent past its lease: the task goes back to the queue
    leases_b = client.lease(node_id=b, max_tasks=1, versions={"policy": 5}).leases
    (lease_b,) = [lease for lease in leases_b if lease.task.id == lease_a.task.id]
    assert [p.index for p in lease_b.partials] == [0, 2]
    carried = lease_b.partials[0]
    assert carried == _partial(
        0, 2, task=task
    )  # tokens, log-probs, versions, env and workflow state
    assert carried.trajectories[0].versions[3:5] == [3, 3]  # A's versions, not B's 5

    # A is back from its partition: its lease is no longer active, its saves are refused
    late = client.save_partials(
        node_id=a, lease_id=lease_a.id, partials=[_partial(0, 3, task=task)]
    )
    assert not late.accepted and "expired" in late.reason
    # B resumed episode 0 and saves its next turn under its own lease
    assert client.save_partials(
        node_id=b, lease_id=lease_b.id, partials=[_partial(0, 3, task=task)]
    ).accepted
    assert [(r.index, r.turns, r.lease_id) for r in _saved(svc)] == [
        (0, 3, lease_b.id),
        (2, 1, lease_a.id),
    ]
    # the task completes: nothing of it is kept to resume
    pushed = client.push(node_id=b, lease_id=lease_b.id, episodes=group(lease_b.task.id, [1] * 4))
    assert pushed.accepted
    assert _saved(svc) == []


def test_only_the_holder_of_an_active_lease_may_save(run):
    svc, client, _ = run
    a, b = _node(client, "A"), _node(client, "B")
    (lease,) = client.lease(node_id=a, max_tasks=1, versions={"policy": 0}).leases
    other = client.save_partials(node_id=b, lease_id=lease.id, partials=[_partial(0, 1)])
    assert not other.accepted and "another node" in other.reason and a not in other.reason
    unknown = client.save_partials(node_id=a, lease_id="lease-nope", partials=[_partial(0, 1)])
    assert not unknown.accepted and "unknown lease" in unknown.reason
    client.release(a, [lease.id])
    released = client.save_partials(node_id=a, lease_id=lease.id, partials=[_partial(0, 1)])
    assert not released.accepted and "released" in released.reason
    assert _saved(svc) == []


def test_saves_are_validated_at_the_door(run):
    svc, client, _ = run
    client.announce_version(
        policy="policy", version=0, location="mem://0", digest="d0", vocab_size=64
    )
    a = _node(client, "A")
    (lease,) = client.lease(node_id=a, max_tasks=1, versions={"policy": 0}).leases

    def refused(partials):
        with pytest.raises(RequestRejected) as err:
            client.save_partials(node_id=a, lease_id=lease.id, partials=partials)
        assert err.value.status == 422
        return err.value

    assert refused([_partial(GROUP, 1)]).fields == ["partials.0.index"]
    assert refused([_partial(0, 1), _partial(0, 2)]).fields == ["partials.1"]
    assert refused([_partial(0, 1, role="judge")]).fields == ["partials.0.trajectories"]
    big = _partial(0, 1)
    big.trajectories[0].tokens[3] = 64  # outside the announced vocabulary [0, 64)
    assert refused([big]).fields == ["partials.0.trajectories.0.tokens"]
    # malformed arrays are refused by the protocol type itself (sent raw: the client would not
    # build such a body)
    body = _partial(0, 1).model_dump(mode="json")
    body["trajectories"][0]["loss_mask"] = [1] * len(body["trajectories"][0]["tokens"])
    with httpx.Client(base_url=svc.url, headers={"authorization": f"Bearer {TOKEN}"}) as http:
        reply = http.post(
            "/partials", json={"node_id": a, "lease_id": lease.id, "partials": [body]}
        )
    assert reply.status_code == 422, reply.text
    assert "loss_mask" in reply.text
    assert _saved(svc) == []
