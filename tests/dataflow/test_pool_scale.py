"""What keeps one dataflow service's load bounded as its pool of nodes grows (the limits
bench/dataflow_scale.py found): the heartbeat interval it asks of nodes grows with the pool,
and the registration bound is the recipe's."""

from __future__ import annotations

import time

from dataflow_helpers import TOKEN, ThreadedService, make_recipe

from astraflow.protocol.client import SyncDataflowClient


def test_a_larger_pool_is_asked_to_heartbeat_less_often(tmp_path):
    """The pool as a whole is held to dataflow.max_heartbeats_per_s: each node learns the
    interval at registration and from every heartbeat reply; it never passes a quarter of the
    lease timeout."""
    recipe = make_recipe(
        tmp_path,
        dataflow={
            "heartbeat_interval_s": 1.0,
            "max_heartbeats_per_s": 2.0,
            "lease_timeout_s": 20.0,
            "max_nodes": 64,
        },
    )
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        regs = [client.register(policies={"policy": 0}, name=f"n{i}") for i in range(12)]
        # two nodes fit the base interval; the sixth is asked for 6 / 2 = 3 s
        assert [r.heartbeat_interval_s for r in regs[:2]] == [1.0, 1.0]
        assert regs[5].heartbeat_interval_s == 3.0
        # twelve would need 6 s: capped at a quarter of the 20 s lease timeout
        assert regs[11].heartbeat_interval_s == 5.0
        # the first node hears of the new interval in its next heartbeat reply
        assert client.heartbeat(regs[0].node_id).heartbeat_interval_s == 5.0


def test_expired_idempotency_keys_are_pruned_in_bounded_chunks(tmp_path):
    """A busy run stores a key per push and per lease grant (kept a day): pruning forgets the
    expired ones oldest first, a bounded number per transaction, and keeps the rest."""
    from astraflow.dataflow.storage import idempotency
    from astraflow.dataflow.storage.store import Store

    store = Store(tmp_path / "s.db")
    now = 1_000_000.0
    old = now - idempotency.IDEMPOTENCY_TTL_S - 1

    def fill(tx):
        for i in range(5):
            idempotency.remember(tx, f"push/n/old{i}", "push", b"r", old + i * 1e-3)
        idempotency.remember(tx, "push/n/new", "push", b"r", now - 10)

    store.call(fill)
    assert store.call(lambda tx: idempotency.prune(tx, now, limit=2)) == 2
    assert store.call(lambda tx: idempotency.remembered(tx, "push/n/old0", "push")) is None
    assert store.call(lambda tx: idempotency.remembered(tx, "push/n/old2", "push")) == b"r"
    assert store.call(lambda tx: idempotency.prune(tx, now, limit=10)) == 3
    assert store.call(lambda tx: idempotency.remembered(tx, "push/n/new", "push")) == b"r"
    store.close()


def test_a_large_pool_hears_of_versions_from_heartbeats_not_by_ending_parked_requests(tmp_path):
    """Every parked request answered at each version came straight back: thousands of requests
    in a burst per version from a large pool. Once heartbeats are paced (the pool is past the
    heartbeat budget) a node within max_lag stays parked and hears of the version from its
    heartbeat; one that must update first is still answered at once."""
    import time

    from test_lease_wait import Parked, _prompt

    recipe_kw = {
        "dataflow": {
            "max_heartbeats_per_s": 1.0,  # 3 nodes at a 2 s base interval: paced
            "max_lag": 1,
            "lease_timeout_s": 60.0,
            "buffer_steps": 0,
        },
        "tasks": {
            "group_size": 2,
            "epochs": 1,
            "sets": [{"name": "arith", "split": "train", "limit": 1}],
        },
    }
    recipe = make_recipe(tmp_path, **recipe_kw)
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as c,
    ):
        a, b, _ = (c.register(policies={"policy": 0}, name=f"n{i}").node_id for i in range(3))
        assert len(c.lease(node_id=a, max_tasks=5, versions={"policy": 0}).leases) == 1
        parked = Parked(svc, b, {"policy": 0})  # nothing left: parks
        parked.settle(svc)
        c.announce_version(policy="policy", version=1, location="http://w/1", digest="d1")
        time.sleep(0.5)
        assert not parked.future.done()  # within max_lag: stays parked
        assert c.heartbeat(b).latest_versions == {"policy": 1}  # the heartbeat brings it
        t0 = time.monotonic()
        c.announce_version(policy="policy", version=2, location="http://w/2", digest="d2")
        grant = _prompt(parked, t0)  # two behind, past max_lag: told at once to update
        assert grant.update_first and grant.latest_versions == {"policy": 2}


def _pass(svc, nodes: list[str]) -> tuple[int, set[str], list]:
    """One dispatch pass over parked requests of ``nodes``: how many SQL statements it ran, the
    nodes named in them (their rows or their stored replies read), and its outcomes."""
    from astraflow.dataflow.ops import leasing
    from astraflow.protocol import LeaseRequest

    reqs = [
        LeaseRequest(
            node_id=n, max_tasks=1, versions={"policy": 0}, wait_s=10, idempotency_key=f"k-{n}"
        )
        for n in nodes
    ]
    statements: list[str] = []

    def one_pass(tx):
        tx.conn.set_trace_callback(statements.append)
        try:
            return leasing.serve(svc.service.ctx, tx, reqs, touch=False)[0]
        finally:
            tx.conn.set_trace_callback(None)

    outcomes = svc.service.store.call(one_pass)
    named = {n for n in nodes if any(n in sql for sql in statements)}
    return len(statements), named, outcomes


def test_a_dispatch_pass_reads_no_more_with_more_parked_requests(tmp_path):
    """A pass after an event reads what the first requests it tries need; requests holding the
    same versions as one that found nothing get its answer without a read of their own (their
    stored reply, their node). With every pass reading each parked request's rows, 4,096 parked
    nodes made each pass cost in proportion to them, and heartbeats queued behind the passes."""
    tasks = {
        "group_size": 2,
        "epochs": 1,
        "sets": [{"name": "arith", "split": "train", "limit": 1}],
    }
    recipe = make_recipe(tmp_path, tasks=tasks, dataflow={"max_nodes": 256})
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0) as client,
    ):
        nodes = [client.register(policies={"policy": 0}).node_id for _ in range(120)]
        few, _, few_out = _pass(svc, nodes[:3])
        many, named, many_out = _pass(svc, nodes[3:])
        # the one task goes to the first request of the first pass; every other finds nothing
        assert [len(o.leases) for o in few_out] == [1, 0, 0]
        assert all(not o.leases and not o.done for o in many_out)
        assert many <= few, (few, many)
        assert named == {nodes[3]}, f"{len(named)} parked requests' rows read"


def test_a_heartbeat_without_leases_waits_for_no_store_transaction(tmp_path):
    """A node that holds no lease is answered without a transaction on the store's one writer
    (every heartbeat a write transaction queued heartbeats behind every lease pass and push:
    hundreds of milliseconds at 4,096 nodes); its liveness is persisted by the next liveness
    write. A heartbeat that renews leases still waits for its transaction."""
    import threading

    from astraflow.dataflow.storage import nodes as node_rows

    recipe = make_recipe(tmp_path, dataflow={"max_nodes": 64})
    with (
        ThreadedService(recipe, tmp_path / "df.db") as svc,
        SyncDataflowClient(svc.url, TOKEN, retries=0, timeout=5.0) as client,
    ):
        node = client.register(policies={"policy": 0}).node_id
        client.heartbeat(node)  # the first one (the service learns the node is active) is a write
        store = svc.service.store
        release = threading.Event()
        held = store.submit(lambda tx: release.wait(30))  # the writer is busy until released
        try:
            ops, before = store.ops, svc.service.ctx.now()
            replies = [client.heartbeat(node, versions={"policy": 0}) for _ in range(3)]
            assert store.ops == ops, "a heartbeat waited for a store transaction"
            assert all(not r.stop and r.renewed == [] for r in replies)
        finally:
            release.set()
            held.result(timeout=30)
        # persisted: one liveness write for the heartbeats that arrived meanwhile
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and svc.service._beats:
            time.sleep(0.01)
        beat = store.call(lambda tx: node_rows.last_heartbeat(tx, node))
        assert beat >= before
        assert store.call(lambda tx: node_rows.state(tx, node)) == "active"
        # a node with leases in flight is renewed in a transaction, as before
        (lease,) = client.lease(node_id=node, max_tasks=1, versions={"policy": 0}).leases
        ops = store.ops
        assert lease.id in client.heartbeat(node, in_flight=[lease.id]).renewed
        assert store.ops > ops
