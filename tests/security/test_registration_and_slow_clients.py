"""Issue 48 #7: registration and connection abuse by a node token, on real HTTP on loopback.

Why: ``replace=true`` with a victim's name retired it without its node key; registrations that
never heartbeat were never reaped, so 1,024 of them locked every new node out (429); 30 fake
nodes that never leased held the autoscaler at one node; and the dataflow's server had no header
or body read timeout, so 1,000 slow connections from one client stayed open.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from dataflow_helpers import ManualClock, ThreadedService, make_recipe
from hostile import NODE_TOKEN, Raw

from astraflow.dataflow import storage
from astraflow.dataflow.ops import registration
from astraflow.protocol.client import SyncDataflowClient
from astraflow.protocol.http_server import HTTPServer
from astraflow.protocol.messages import NODE_KEY_HEADER


def reg(name: str, replace: bool = False) -> dict:
    return {"name": name, "policies": {"policy": 0}, "replace": replace}


def active_ids(svc, *node_ids: str) -> set[str]:
    """Which of ``node_ids`` are active registrations."""
    states = svc.service.store.call(lambda tx: storage.nodes.states(tx, list(node_ids)))
    return {n for n, state in states.items() if state == "active"}


def test_replace_needs_the_namesakes_node_key(tmp_path):
    recipe = make_recipe(tmp_path, dataflow={"lease_timeout_s": 600.0, "heartbeat_interval_s": 0.2})
    clock = ManualClock()
    with ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc:
        node = Raw(svc.url)
        try:
            victim = node.json("POST", "/nodes/register", reg("node-0")).json()
            clock.advance(0.5)  # the victim missed two heartbeats (a GC pause, a slow link)
            thief = node.json("POST", "/nodes/register", reg("node-0", replace=True))
            assert thief.status_code == 200
            assert victim["node_id"] in active_ids(
                svc, victim["node_id"]
            )  # untouched without its key
            wrong = node.json(
                "POST",
                "/nodes/register",
                reg("node-0", replace=True),
                headers={NODE_KEY_HEADER: "not-the-key"},
            )
            assert wrong.status_code == 200 and active_ids(svc, victim["node_id"])
            # the restarted node itself, holding its old key, does retire it
            own = node.json(
                "POST",
                "/nodes/register",
                reg("node-0", replace=True),
                headers={NODE_KEY_HEADER: victim["node_key"]},
            )
            assert own.status_code == 200 and not active_ids(svc, victim["node_id"])
        finally:
            node.close()


def test_silent_registrations_are_reaped_so_new_nodes_get_in(tmp_path):
    recipe = make_recipe(
        tmp_path, dataflow={"max_nodes": 4, "lease_timeout_s": 30.0, "heartbeat_interval_s": 1.0}
    )
    clock = ManualClock()
    with ThreadedService(recipe, tmp_path / "df.db", config_kwargs={"clock": clock}) as svc:
        node = Raw(svc.url)
        try:
            fakes = [  # registrations that never heartbeat fill the pool
                node.json("POST", "/nodes/register", reg(f"fake-{i}")).json()["node_id"]
                for i in range(4)
            ]
            locked = node.json("POST", "/nodes/register", reg("honest"))
            assert locked.status_code == 429 and "limit is 4" in locked.json()["detail"]
            clock.advance(registration.idle_bound_s(svc.service.ctx) + 1)
            honest = node.json("POST", "/nodes/register", reg("honest"))
            assert honest.status_code == 200, honest.text
            honest_id = honest.json()["node_id"]
            assert active_ids(svc, *fakes, honest_id) == {honest_id}
            # a reaped node's next heartbeat is told it left: an honest one registers again
            gone = node.json("POST", f"/nodes/{fakes[0]}/heartbeat", {"versions": {"policy": 0}})
            assert gone.status_code == 404
        finally:
            node.close()


def test_registrations_per_caller_are_rate_limited_but_admin_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(registration, "REGISTRATION_BURST", 3)
    monkeypatch.setattr(registration, "REGISTRATIONS_PER_S", 0.001)
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        node = Raw(svc.url)
        try:
            codes = [
                node.json("POST", "/nodes/register", reg(f"n{i}")).status_code for i in range(4)
            ]
            assert codes == [200, 200, 200, 429]
            refused = node.json("POST", "/nodes/register", reg("n9"))
            assert "registrations by the node token from 127.0.0.1" in refused.json()["detail"]
            with SyncDataflowClient(svc.url, "test-token-123", retries=0) as admin:
                for i in range(4):
                    admin.register(name=f"a{i}", policies={"policy": 0})
        finally:
            node.close()


def ok_app():
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while True:  # read the whole body first
            message = await receive()
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


@pytest.fixture
def server():
    http = HTTPServer(
        ok_app(),
        lifespan="off",
        header_timeout_s=0.5,
        body_idle_timeout_s=0.5,
        max_pending_per_client=8,
    )
    http.start_in_thread()
    try:
        yield http
    finally:
        http.stop_thread(timeout=10)


def read_reply(sock: socket.socket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(4096):
            out += chunk
    except TimeoutError:
        pass
    return out


def test_a_connection_that_never_finishes_its_headers_is_closed_with_408(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nhost: x\r\n")  # and nothing more
        start = time.monotonic()
        reply = read_reply(sock)
        assert reply.startswith(b"HTTP/1.1 408") and b"headers not received" in reply
        assert time.monotonic() - start < 3
    with socket.create_connection(("127.0.0.1", server.port)) as sock:  # nothing at all
        assert read_reply(sock).startswith(b"HTTP/1.1 408")


def test_a_stalled_body_is_closed_with_408(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nabc")
        reply = read_reply(sock)
        assert reply.startswith(b"HTTP/1.1 408") and b"body stalled" in reply


def test_slow_connections_from_one_client_are_capped_and_others_still_served(server):
    slow = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(8)]
    try:
        for s in slow:
            s.sendall(b"GET / HTTP/1.1\r\n")
        time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", server.port)) as extra:
            assert read_reply(extra, 2).startswith(b"HTTP/1.1 429")
    finally:
        for s in slow:
            s.close()
    time.sleep(0.2)  # closed connections are no longer counted
    assert httpx.get(server.url, timeout=5).text == "ok"
    # pooled keep-alive connections that finished their requests are not counted
    with httpx.Client(limits=httpx.Limits(max_connections=20)) as pooled:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda _: pooled.get(server.url).status_code, range(64)))
    assert replies == [200] * 64


def test_the_dataflow_service_closes_slow_connections(tmp_path, monkeypatch):
    """The dataflow's own server is built with the guarded protocol (defaults here shortened)."""
    from astraflow.protocol import slow_clients

    monkeypatch.setattr(slow_clients.GuardedHttpTools, "header_timeout_s", 0.5)
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        port = int(svc.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /nodes/register HTTP/1.1\r\n")
            assert read_reply(sock).startswith(b"HTTP/1.1 408")
        with httpx.Client(base_url=svc.url, headers={"authorization": f"Bearer {NODE_TOKEN}"}) as c:
            assert c.post("/nodes/register", json=reg("fine")).status_code == 200


def test_the_autoscaler_counts_only_nodes_that_take_work():
    """30 fake nodes that registered and never leased are no capacity: a starved trainer with
    the launcher's one node full grows the pool (it held at one node before)."""
    from astraflow.launch.autoscale import Autoscaler, figures
    from astraflow.protocol.status import DataflowStatus, NodeStatus, PolicyStatus
    from astraflow.recipe.schema import AutoscaleConfig

    def node(name, leases=0, rate=0.0):
        return NodeStatus(id=f"id-{name}", name=name, region="local", state="active",
                          last_heartbeat=0.0, seconds_since_heartbeat=0.0, versions={},
                          episodes=0, episodes_per_s=rate, active_leases=leases)  # fmt: skip

    pol = PolicyStatus(trainable=True, latest_version=3, weight_location=None, steps=3,
                       max_steps=10, buffer_groups=0, buffer_samples=0, unacked_batches=0,
                       staleness={}, dropped={}, trainer_idle=0.9, cap_groups=8)  # fmt: skip
    nodes = [node("node-0", leases=2, rate=1.0)] + [node(f"fake-{i}") for i in range(30)]
    nodes.append(node("operator-box", leases=1))
    st = DataflowStatus(run="r", mode="async", time=0.0, done=False, training_done=False,
                        queue={}, in_flight_leases=4, training_in_flight=4, expired_leases=0,
                        tasks_done=0, episodes=0, episodes_per_s=0.0, nodes=nodes,
                        policies={"policy": pol}, evaluations=[],
                        dataflow_policies=[])  # fmt: skip
    f = figures(st, pool={"node-0"}, draining=set(), groups_per_node=2)
    assert f.nodes == 2  # node-0 and the operator's working node; no fake
    cfg = AutoscaleConfig(
        enabled=True, min_nodes=1, max_nodes=4, sustain=1, cooldown_s=0,
        target_trainer_idle=0.2, target_buffer_fill=None,
    )  # fmt: skip
    a = Autoscaler(cfg)
    assert a.decide(f, 0.0).action == "grow"
