"""Long-polling lease requests (``LeaseRequest.wait_s``) through the real service over loopback.

A request that finds no work parks at the service; each event that can create work for it (a push
or a served batch freeing backpressure room, an ack or a version announcement advancing a sync
round, an older version re-announced, a lease released or expired, a node leaving, an evaluation
request, the run ending) must answer it at once. Time bounds are generous: "answered well before
wait_s ran out" is the behaviour under test, not a latency figure (bench/lease_wakeup.py
measures that).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe

from astraflow.protocol import LeaseGrant
from astraflow.protocol.client import NotFoundError, SyncDataflowClient

WAIT_S = 10.0
#: far below WAIT_S: an answer this fast came from the event, not from the wait running out
PROMPT_S = 4.0

_pool = ThreadPoolExecutor(max_workers=8)


def _serve(tmp_path, config_kwargs=None, **sections):
    kwargs = {"config_kwargs": config_kwargs} if config_kwargs else {}
    return ThreadedService(make_recipe(tmp_path, **sections), tmp_path / "df.db", **kwargs)


def _client(svc) -> SyncDataflowClient:
    return SyncDataflowClient(svc.url, TOKEN, retries=0)


class Parked:
    """A lease request sent from its own thread and client, so the test can act meanwhile."""

    def __init__(
        self,
        svc,
        node: str,
        versions: dict[str, int],
        wait_s: float = WAIT_S,
        key: str | None = None,
    ) -> None:
        self.client = _client(svc)
        self.sent = time.monotonic()
        self.future: Future[LeaseGrant] = _pool.submit(
            self.client.lease,
            node_id=node,
            max_tasks=1,
            versions=versions,
            wait_s=wait_s,
            idempotency_key=key,
        )
        self.answered_at: float | None = None
        self.future.add_done_callback(lambda _f: setattr(self, "answered_at", time.monotonic()))

    def settle(self, svc, seconds: float = 0.3) -> None:
        """Give the request time to reach the service and park (it must still be waiting)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not svc.service._lease_waiters:
            time.sleep(0.01)
        time.sleep(seconds)
        assert not self.future.done(), self.future.result()

    def answer(self, timeout: float = WAIT_S + 10) -> tuple[LeaseGrant, float]:
        """The reply and when it came."""
        try:
            return self.future.result(timeout=timeout), self.answered_at
        finally:
            self.client.close()


def _prompt(parked: Parked, since: float) -> LeaseGrant:
    grant, at = parked.answer()
    assert at - since < PROMPT_S, f"answered {at - since:.2f}s after the event (wait_s {WAIT_S})"
    return grant


def _finite_sets(n: int) -> dict:
    return {"group_size": 2, "epochs": 1, "sets": [{"name": "arith", "split": "train", "limit": n}]}


def test_empty_reply_after_wait_s_when_nothing_happens(tmp_path):
    with _serve(tmp_path, tasks=_finite_sets(1)) as svc, _client(svc) as c:
        node = c.register(policies={"policy": 0}).node_id
        assert len(c.lease(node_id=node, max_tasks=5, versions={"policy": 0}).leases) == 1
        t0 = time.monotonic()
        grant = c.lease(node_id=node, max_tasks=1, versions={"policy": 0}, wait_s=1.0)
        waited = time.monotonic() - t0
        assert grant.leases == [] and not grant.done
        assert "exhausted" in grant.reason
        assert 0.9 <= waited < 6.0, waited
        # wait_s = 0 (the default) answers at once, as before
        t0 = time.monotonic()
        assert c.lease(node_id=node, max_tasks=1, versions={"policy": 0}).leases == []
        assert time.monotonic() - t0 < 0.9


def test_wait_s_is_bounded():
    from astraflow.protocol import LeaseRequest

    with pytest.raises(ValueError):
        LeaseRequest(node_id="n", max_tasks=1, versions={}, wait_s=601)
    with pytest.raises(ValueError):
        LeaseRequest(node_id="n", max_tasks=1, versions={}, wait_s=-1)


def test_release_and_deregister_wake_a_parked_request(tmp_path):
    with _serve(tmp_path, tasks=_finite_sets(2)) as svc, _client(svc) as c:
        a = c.register(policies={"policy": 0}).node_id
        b = c.register(policies={"policy": 0}).node_id
        first, second = c.lease(node_id=a, max_tasks=5, versions={"policy": 0}).leases
        parked = Parked(svc, b, {"policy": 0})
        parked.settle(svc)
        t0 = time.monotonic()
        c.release(a, [first.id])
        grant = _prompt(parked, t0)
        assert [lease.task.id for lease in grant.leases] == [first.task.id]

        parked = Parked(svc, b, {"policy": 0})
        parked.settle(svc)
        t0 = time.monotonic()
        c.deregister(a)  # its remaining lease goes back to the queue
        grant = _prompt(parked, t0)
        assert [lease.task.id for lease in grant.leases] == [second.task.id]


def test_lease_expiry_wakes_a_parked_request(tmp_path):
    with (
        _serve(
            tmp_path, tasks=_finite_sets(1), dataflow={"lease_timeout_s": 1.0, "buffer_steps": 0}
        ) as svc,
        _client(svc) as c,
    ):
        a = c.register(policies={"policy": 0}).node_id
        b = c.register(policies={"policy": 0}).node_id
        (taken,) = c.lease(node_id=a, max_tasks=5, versions={"policy": 0}).leases
        parked = Parked(svc, b, {"policy": 0})
        # node a goes silent: its lease expires 1 s after it was issued
        grant, at = parked.answer()
        assert [lease.task.id for lease in grant.leases] == [taken.task.id]
        assert at - parked.sent < PROMPT_S


def _just_after_a_sweep(svc) -> None:
    """Return right after a pass of the lease sweeper (about one a second, its first one two
    store operations), so the store operations counted in the next few tenths of a second are the
    test's own. Call it while nothing else runs on the store."""
    ops = svc.service.store.ops
    deadline = time.monotonic() + 5
    while svc.service.store.ops == ops and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(0.05)  # the first pass's second operation


def test_push_of_a_dropped_group_frees_backpressure_room(tmp_path):
    """The push that completes a group the filter drops frees an in-flight slot and wakes the
    parked request. A push of part of the group changes nothing a parked request waits for: it
    must not set off a lease pass (under load every push did, and the passes cost the writer as
    much as the pushes themselves)."""
    with (
        _serve(
            tmp_path,
            dataflow={"buffer_steps": 1, "policies": [{"name": "zero_variance_filter"}]},
        ) as svc,
        _client(svc) as c,
    ):
        node = c.register(policies={"policy": 0}).node_id
        leases = c.lease(node_id=node, max_tasks=5, versions={"policy": 0}).leases
        assert len(leases) == 2  # cap = buffer_steps x groups_per_step
        parked = Parked(svc, node, {"policy": 0})
        parked.settle(svc)
        _just_after_a_sweep(svc)
        episodes = group(leases[0].task.id, [1] * 4)
        generation, ops = svc.service._generation, svc.service.store.ops
        assert c.push(node_id=node, lease_id=leases[0].id, episodes=episodes[:3]).accepted
        time.sleep(0.3)
        assert svc.service._generation == generation  # no signal
        assert svc.service.store.ops == ops + 1  # the push alone, no lease pass
        assert not parked.future.done()
        t0 = time.monotonic()
        # a zero-variance group is dropped at ingestion: one in-flight slot frees, nothing buffers
        c.push(node_id=node, lease_id=leases[0].id, episodes=episodes[3:])
        grant = _prompt(parked, t0)
        assert len(grant.leases) == 1


def test_served_batch_frees_backpressure_room(tmp_path):
    with _serve(tmp_path, dataflow={"buffer_steps": 1}) as svc, _client(svc) as c:
        node = c.register(policies={"policy": 0}).node_id
        leases = c.lease(node_id=node, max_tasks=5, versions={"policy": 0}).leases
        for lease in leases:
            c.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 0, 1, 0]))
        parked = Parked(svc, node, {"policy": 0})
        parked.settle(svc)
        assert (
            "backpressure"
            in svc.service._lease_waiters[next(iter(svc.service._lease_waiters))].last.reason
        )
        t0 = time.monotonic()
        batch = c.next_batch(policy="policy", num_groups=2, trainer_version=0).batch
        assert batch is not None
        assert len(_prompt(parked, t0).leases) == 1


def _sync(tmp_path, **kw):
    run = {"name": "s", "output_dir": str(tmp_path / "runs"), "mode": "sync", "max_steps": 3}
    return _serve(tmp_path, run=run, tasks={"group_size": 2}, **kw)


def _finish_round(c, node, version: int) -> str:
    leases = c.lease(node_id=node, max_tasks=10, versions={"policy": version}).leases
    assert len(leases) == 2
    for lease in leases:
        c.push(node_id=node, lease_id=lease.id, episodes=group(lease.task.id, [1, 0]))
    return c.next_batch(policy="policy", num_groups=2, trainer_version=version).batch.id


@pytest.mark.parametrize("last", ["announce", "ack"])
def test_sync_round_advance_wakes_a_parked_request(tmp_path, last):
    with _sync(tmp_path) as svc, _client(svc) as c:
        node = c.register(policies={"policy": 0}).node_id
        batch_id = _finish_round(c, node, 0)
        # the node already holds version 1 (fetched as soon as it was published): round 1 has
        # not started, so it parks until the round advances
        parked = Parked(svc, node, {"policy": 1})
        if last == "announce":
            c.ack(batch_id, trainer_version=1)
        else:
            c.announce_version(policy="policy", version=1, location="http://w/1", digest="d")
        parked.settle(svc)
        t0 = time.monotonic()
        if last == "announce":
            c.announce_version(policy="policy", version=1, location="http://w/1", digest="d")
        else:
            c.ack(batch_id, trainer_version=1)
        grant = _prompt(parked, t0)
        assert len(grant.leases) == 1 and c.status()["round"] == 1


def test_a_parked_node_hears_of_the_version_it_needs_at_once(tmp_path):
    """A node still holding version 0 when round 1 starts gets no task until it loads version 1,
    so its parked request is answered at once, empty, naming the new version; left parked it
    would learn of it only at its next heartbeat (every round would then take a heartbeat)."""
    with _sync(tmp_path) as svc, _client(svc) as c:
        node = c.register(policies={"policy": 0}).node_id
        batch_id = _finish_round(c, node, 0)
        c.ack(batch_id, trainer_version=1)
        parked = Parked(svc, node, {"policy": 0})
        parked.settle(svc)
        t0 = time.monotonic()
        c.announce_version(policy="policy", version=1, location="http://w/1", digest="d")
        grant = _prompt(parked, t0)
        assert not grant.leases and grant.latest_versions == {"policy": 1}
        assert grant.update_first  # the round needs version 1
        assert grant.weight_locations["policy"] == "http://w/1"
        # holding version 1, it gets round 1's task at once
        assert len(c.lease(node_id=node, max_tasks=1, versions={"policy": 1}).leases) == 1


def test_a_lagging_node_is_answered_at_once_and_admitted_after_a_reannounce(tmp_path):
    with _serve(tmp_path, dataflow={"max_lag": 1, "buffer_steps": 0}) as svc, _client(svc) as c:
        node = c.register(policies={"policy": 0}).node_id
        c.announce_version(policy="policy", version=3, location="http://w/3", digest="d")
        # too stale for admission control: told at once which version to load, not parked
        t0 = time.monotonic()
        grant = c.lease(node_id=node, max_tasks=1, versions={"policy": 0}, wait_s=WAIT_S)
        assert time.monotonic() - t0 < PROMPT_S
        assert not grant.leases and grant.latest_versions == {"policy": 3}
        assert grant.update_first
        assert not svc.service._lease_waiters
        # the trainer restarted from its version-1 checkpoint: versions 2 and 3 no longer exist
        c.announce_version(policy="policy", version=1, location="http://w/1", digest="d")
        grant = c.lease(node_id=node, max_tasks=1, versions={"policy": 0}, wait_s=WAIT_S)
        assert len(grant.leases) == 1 and grant.latest_versions == {"policy": 1}


def test_evaluation_request_wakes_a_parked_request(tmp_path):
    with _sync(tmp_path) as svc, _client(svc) as c:
        node = c.register(policies={"policy": 0}).node_id
        assert len(c.lease(node_id=node, max_tasks=10, versions={"policy": 0}).leases) == 2
        parked = Parked(svc, node, {"policy": 0})  # round 0 has nothing left
        parked.settle(svc)
        t0 = time.monotonic()
        c.request_evaluation(policy="policy", version=0, num_tasks=3)
        grant = _prompt(parked, t0)
        assert len(grant.leases) == 1 and grant.leases[0].task.meta.get("eval") is True


def test_run_end_answers_parked_requests_with_done(tmp_path):
    recipe = {"policy": {"model": "builtin:tiny-arith", "trainable": False}}
    with (
        _serve(tmp_path, config_kwargs={"done_grace_s": 0.5}, policies=recipe,
               tasks=_finite_sets(1)) as svc,
        _client(svc) as c,
    ):  # fmt: skip
        a = c.register(policies={"policy": 0}).node_id
        (lease,) = c.lease(node_id=a, max_tasks=5, versions={"policy": 0}).leases
        parked = [Parked(svc, a, {"policy": 0}) for _ in range(3)]
        parked[0].settle(svc)
        # a trainer (or the launcher) long-polls for the end of the run the same way
        with _client(svc) as watcher:
            status = _pool.submit(watcher.status, wait_done_s=WAIT_S)
            time.sleep(0.3)
            assert not status.done()
            t0 = time.monotonic()
            c.push(node_id=a, lease_id=lease.id, episodes=group(lease.task.id, [1, 0]))
            # the last task is done; the run is over once the grace period passed, with no
            # further event: the service's own timer answers every parked request
            for p in parked:
                grant = _prompt(p, t0)
                assert grant.done and grant.leases == []
            assert status.result(timeout=WAIT_S + 10)["done"]
            assert time.monotonic() - t0 < PROMPT_S


def test_heartbeats_work_while_a_lease_request_is_parked(tmp_path):
    with _serve(tmp_path, tasks=_finite_sets(1), dataflow={"lease_timeout_s": 2.0}) as svc:
        with _client(svc) as c:
            node = c.register(policies={"policy": 0}).node_id
            (held,) = c.lease(node_id=node, max_tasks=5, versions={"policy": 0}).leases
            parked = Parked(svc, node, {"policy": 0}, wait_s=5.0)
            parked.settle(svc, 0.1)
            beats = []
            while not parked.future.done():
                t0 = time.monotonic()
                reply = c.heartbeat(node, in_flight=[held.id])
                beats.append(time.monotonic() - t0)
                assert held.id in reply.renewed
                time.sleep(0.25)
            grant, _ = parked.answer()
            # the heartbeats kept the held lease alive past its 2 s timeout, so nothing came free
            assert grant.leases == [] and "exhausted" in grant.reason
            assert len(beats) >= 8 and max(beats) < 2.0, beats


def test_parked_nodes_are_served_in_arrival_order_one_transaction_per_event(tmp_path):
    with _serve(tmp_path, tasks=_finite_sets(4)) as svc, _client(svc) as c:
        holder = c.register(policies={"policy": 0}).node_id
        held = c.lease(node_id=holder, max_tasks=10, versions={"policy": 0}).leases
        assert len(held) == 4
        nodes = [c.register(policies={"policy": 0}).node_id for _ in range(6)]
        parked = []
        for node in nodes:
            parked.append(Parked(svc, node, {"policy": 0}))
            while len(svc.service._lease_waiters) < len(parked):
                time.sleep(0.01)
        ops_before = svc.service.store.ops
        for i, lease in enumerate(held[:3]):
            t0 = time.monotonic()
            c.release(holder, [lease.id])
            grant = _prompt(parked[i], t0)  # first come, first served
            assert [x.task.id for x in grant.leases] == [lease.task.id]
        time.sleep(0.3)
        assert [p.future.done() for p in parked] == [True] * 3 + [False] * 3
        # each release: its own op plus about one dispatch pass for all six parked requests, not
        # one transaction per parked node per event
        assert svc.service.store.ops - ops_before <= 3 * 4, svc.service.store.ops - ops_before
        c.deregister(holder)  # its last lease goes back: the next in line gets it
        assert [x.task.id for x in _prompt(parked[3], time.monotonic()).leases] == [held[3].task.id]
        # a node that leaves while its request is parked gets its answer (an error) at once
        for node, p in zip(nodes[4:], parked[4:], strict=True):
            t0 = time.monotonic()
            c.deregister(node)
            with pytest.raises(NotFoundError, match="deregistered"):
                _prompt(p, t0)


def test_retry_of_a_parked_request_gets_the_leases_it_was_granted(tmp_path):
    """A node that abandons a parked request (its weights changed, so it re-asks with the new
    versions) re-sends it under the same idempotency key: leases the parked one was granted come
    back to it instead of staying held by the node unseen."""
    with _serve(tmp_path, tasks=_finite_sets(1)) as svc, _client(svc) as c:
        a = c.register(policies={"policy": 0}).node_id
        b = c.register(policies={"policy": 0}).node_id
        (taken,) = c.lease(node_id=a, max_tasks=5, versions={"policy": 0}).leases
        parked = Parked(svc, b, {"policy": 0}, key="lease-req-parked-1")
        parked.settle(svc)
        t0 = time.monotonic()
        c.release(a, [taken.id])
        granted = _prompt(parked, t0).leases
        assert [x.task.id for x in granted] == [taken.task.id]
        retry = c.lease(
            node_id=b,
            max_tasks=1,
            versions={"policy": 1},
            idempotency_key="lease-req-parked-1",
            wait_s=WAIT_S,
        )
        assert [x.id for x in retry.leases] == [x.id for x in granted]


def test_a_retry_parked_beside_its_original_gets_the_same_leases(tmp_path):
    """The original and its retry (same idempotency key) are both parked when work appears: the
    pass that serves them grants the task once, and both get that grant (the pass reads stored
    replies up front, so it must see the grant it made itself a moment before)."""
    with _serve(tmp_path, tasks=_finite_sets(2)) as svc, _client(svc) as c:
        a = c.register(policies={"policy": 0}).node_id
        b = c.register(policies={"policy": 0}).node_id
        taken = c.lease(node_id=a, max_tasks=5, versions={"policy": 0}).leases
        assert len(taken) == 2
        original = Parked(svc, b, {"policy": 0}, key="lease-req-twice")
        original.settle(svc)
        retry = Parked(svc, b, {"policy": 0}, key="lease-req-twice")
        while len(svc.service._lease_waiters) < 2:
            time.sleep(0.01)
        t0 = time.monotonic()
        c.release(a, [x.id for x in taken])
        first, second = _prompt(original, t0), _prompt(retry, t0)
        assert len(first.leases) == 1
        assert [x.id for x in second.leases] == [x.id for x in first.leases]
        other = c.register(policies={"policy": 0}).node_id
        left = c.lease(node_id=other, max_tasks=5, versions={"policy": 0}).leases
        assert {x.task.id for x in left} == {x.task.id for x in taken} - {first.leases[0].task.id}


def test_a_node_behind_within_max_lag_parks_and_gets_work_first(tmp_path):
    """A node that loads versions more slowly than they are published (a remote region behind a
    slow link) is usually a version or two behind. Within ``max_lag`` it may work, so its request
    parks like any other and is served in arrival order: answering every request at once (as if
    held back) left it asking only at random instants, and a node that syncs fast took all the
    work. A new version answers the parked request at once (else the node would hear of it only
    at its next heartbeat), without ``update_first``: the node asks again straight away and parks
    while its weights load. Past ``max_lag`` the answer says ``update_first``."""
    with (
        _serve(tmp_path, tasks=_finite_sets(2), dataflow={"max_lag": 2}) as svc,
        _client(svc) as c,
    ):
        a = c.register(policies={"policy": 0}).node_id
        slow = c.register(policies={"policy": 0}).node_id
        first, _second = c.lease(node_id=a, max_tasks=5, versions={"policy": 0}).leases
        c.announce_version(policy="policy", version=1, location="http://w/1", digest="d1")
        parked = Parked(svc, slow, {"policy": 0})  # one version behind: parks
        parked.settle(svc)
        t0 = time.monotonic()
        c.announce_version(policy="policy", version=2, location="http://w/2", digest="d2")
        grant = _prompt(parked, t0)  # the news is passed on at once
        assert not grant.leases and grant.latest_versions == {"policy": 2}
        assert not grant.update_first  # two behind is still within max_lag: it may work
        parked = Parked(svc, slow, {"policy": 0})  # asks again at once: parks
        parked.settle(svc)
        time.sleep(0.3)
        assert not parked.future.done()
        t0 = time.monotonic()
        c.release(a, [first.id])
        grant = _prompt(parked, t0)
        assert [lease.task.id for lease in grant.leases] == [first.task.id]

        parked = Parked(svc, slow, {"policy": 0})
        parked.settle(svc)
        t0 = time.monotonic()
        c.announce_version(policy="policy", version=3, location="http://w/3", digest="d3")
        grant = _prompt(parked, t0)  # now past max_lag: told at once, empty, to update
        assert not grant.leases and grant.latest_versions == {"policy": 3}
        assert grant.update_first
        assert "admission control" in (grant.reason or "")


@pytest.mark.parametrize("content_type", ["application/json", "application/msgpack"])
def test_a_parked_request_whose_client_hangs_up_takes_nothing(tmp_path, content_type):
    """A node that gives up on a parked lease request (its client timed out, it was killed, the
    connection was cut) is noticed at once: work that appears afterwards goes to nodes that ask,
    not to the dead request until its lease would expire. Both the FastAPI route (JSON) and the
    fast path (msgpack) are watched."""
    import httpx
    import msgpack

    with _serve(tmp_path, tasks=_finite_sets(1)) as svc, _client(svc) as c:
        a = c.register(policies={"policy": 0}).node_id
        b = c.register(policies={"policy": 0}).node_id
        late = c.register(policies={"policy": 0}).node_id
        (held,) = c.lease(node_id=a, max_tasks=5, versions={"policy": 0}).leases
        body = {"node_id": b, "max_tasks": 1, "versions": {"policy": 0}, "wait_s": 60.0}
        data = msgpack.packb(body) if content_type.endswith("msgpack") else json.dumps(body)
        headers = {
            "authorization": f"Bearer {TOKEN}",
            "content-type": content_type,
            "accept": content_type,
        }
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            httpx.post(
                f"{svc.url}/leases", content=data, headers=headers,
                timeout=httpx.Timeout(10.0, read=1.0),
            )  # fmt: skip
        deadline = time.monotonic() + PROMPT_S
        while svc.service._lease_waiters and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not svc.service._lease_waiters, "the hung-up request is still parked"
        c.release(a, [held.id])  # work appears
        grant = c.lease(node_id=late, max_tasks=1, versions={"policy": 0})
        assert [lease.task.id for lease in grant.leases] == [held.task.id]
