"""Role-scoped tokens against the real dataflow service on loopback: which role may do what.

A node token leases and pushes but gets 403 on ack and on announcing a version; a trainer token
acks but cannot lease; the run secret (admin) does everything; a token of another run is 401.
"""

from __future__ import annotations

import httpx
import msgpack
import pytest
from astraflow.tasks.catalog import load_task_set
from dataflow_helpers import TOKEN, ThreadedService, group, make_recipe

from astraflow.dataflow.http.access import RULES, allowed_roles
from astraflow.dataflow.http.app import create_app
from astraflow.protocol import TrajectoryPush, encode
from astraflow.protocol.auth import (
    ADMIN,
    NODE,
    ROLES,
    TRAINER,
    TokenVerifier,
    derive_token,
    token_role,
)
from astraflow.protocol.client import AuthError, ForbiddenError, SyncDataflowClient

NODE_TOKEN = derive_token(TOKEN, NODE)
TRAINER_TOKEN = derive_token(TOKEN, TRAINER)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("roles")
    with ThreadedService(make_recipe(tmp), tmp / "df.db") as svc:
        yield svc


def _client(service, token):
    return SyncDataflowClient(service.url, token, retries=0)


def _filled_batch(service):
    """A node leases and pushes a group; returns (node client's node id, a batch id)."""
    with _client(service, NODE_TOKEN) as node:
        node_id = node.register(policies={"policy": 0}, name="n").node_id
        for lease in node.lease(node_id=node_id, max_tasks=2, versions={"policy": 0}).leases:
            pushed = node.push(
                node_id=node_id, lease_id=lease.id, episodes=group(lease.task.id, [0, 1, 1, 0])
            )
            assert pushed.accepted
    with _client(service, TRAINER_TOKEN) as trainer:
        reply = trainer.next_batch(policy="policy", num_groups=2, trainer_version=0)
    assert reply.batch is not None
    return node_id, reply.batch.id


def test_node_token_leases_and_pushes_but_cannot_ack_or_publish(service):
    _, batch_id = _filled_batch(service)
    with _client(service, NODE_TOKEN) as node:
        with pytest.raises(ForbiddenError, match="needs a trainer or admin token") as exc:
            node.ack(batch_id, trainer_version=1)
        assert exc.value.status == 403 and "a node token" in exc.value.detail
        with pytest.raises(ForbiddenError, match="POST /versions needs a trainer or admin"):
            node.announce_version(policy="policy", version=1, location="http://x", digest="d")
        with pytest.raises(ForbiddenError):
            node.next_batch(policy="policy", num_groups=1, trainer_version=0)
        with pytest.raises(ForbiddenError):
            node.status()
        with pytest.raises(ForbiddenError):
            node.auth_verifiers()
        assert node.recipe().tasks.group_size == 4  # join information is open to nodes
    # the batch is still unacknowledged: the trainer acks it
    with _client(service, TRAINER_TOKEN) as trainer:
        assert trainer.ack(batch_id, trainer_version=1).ok
        assert trainer.status()["policies"]["policy"]["steps"] == 1


def test_trainer_token_cannot_act_as_a_node(service):
    with _client(service, TRAINER_TOKEN) as trainer:
        with pytest.raises(ForbiddenError, match="needs a node or admin token"):
            trainer.register(policies={"policy": 0}, name="fake")
        with pytest.raises(ForbiddenError):
            trainer.lease(node_id="n", max_tasks=1, versions={"policy": 0})
        digests = trainer.auth_verifiers().digests
    assert set(digests) == set(ROLES)
    # the digests let a service holding no secret check every role's token, and not the secret
    verifier = TokenVerifier.from_digests(digests)
    assert [verifier.role_of(derive_token(TOKEN, r)) for r in ROLES] == list(ROLES)
    assert verifier.role_of(TOKEN) is None


def test_fast_path_is_guarded_too(service):
    """msgpack pushes, leases and heartbeats skip FastAPI; the role check still runs first."""
    push = TrajectoryPush(node_id="n", lease_id="l", episodes=group("t", [1]))
    for path, body in (("/trajectories", encode(push, "application/msgpack")),
                       ("/leases", msgpack.packb({"node_id": "n", "max_tasks": 1})),
                       ("/nodes/n/heartbeat", msgpack.packb({}))):  # fmt: skip
        r = httpx.post(
            service.url + path,
            content=body,
            headers={
                "authorization": f"Bearer {TRAINER_TOKEN}",
                "content-type": "application/msgpack",
                "accept": "application/msgpack",
            },
        )
        assert r.status_code == 403, (path, r.text)
        assert "needs a node or admin token" in r.json()["detail"]


def test_admin_tokens_do_everything_and_foreign_tokens_are_401(service):
    for admin in (TOKEN, derive_token(TOKEN, ADMIN)):
        with _client(service, admin) as c:
            node_id = c.register(policies={"policy": 0}, name="a").node_id
            c.lease(node_id=node_id, max_tasks=1, versions={"policy": 0})
            assert c.status()["run"]
            assert c.auth_verifiers().digests
    for wrong in (derive_token("another-run", NODE), NODE_TOKEN[:-1] + "x", "node.", "x"):
        with _client(service, wrong) as c, pytest.raises(AuthError, match="wrong run token"):
            c.recipe()
    r = httpx.get(f"{service.url}/status", headers={"authorization": "Basic abc"})
    assert r.status_code == 401 and "missing run token" in r.json()["detail"]


def test_openapi_names_each_routes_roles(service):
    doc = httpx.get(
        f"{service.url}/openapi.json", headers={"authorization": f"Bearer {NODE_TOKEN}"}
    ).json()
    assert doc["paths"]["/batches/{batch_id}/ack"]["post"]["x-roles"] == [TRAINER, ADMIN]
    assert doc["paths"]["/trajectories"]["post"]["x-roles"] == [NODE, ADMIN]
    assert doc["paths"]["/recipe"]["get"]["x-roles"] == [NODE, TRAINER, ADMIN]


def test_every_route_has_an_access_rule(tmp_path):
    """A route without a rule would be admin-only; that must be a decision, not an accident."""
    app = create_app(make_recipe(tmp_path), tmp_path / "df.db", TOKEN, task_source=load_task_set)
    patterns = {p for p, _ in RULES}
    for route in app.routes:
        path = getattr(route, "path", None)
        if path and path != "/healthz":
            assert path in patterns, f"{path} has no rule in astraflow/dataflow/http/access.py"
    assert allowed_roles("/no/such/path") == {ADMIN}
    assert allowed_roles("/nodes/abc/heartbeat") == {NODE, ADMIN}


def test_the_service_needs_the_secret_not_a_role_token(tmp_path):
    with pytest.raises(ValueError, match="needs the run secret, not a node token"):
        create_app(make_recipe(tmp_path), tmp_path / "df.db", NODE_TOKEN, task_source=load_task_set)
    assert token_role(NODE_TOKEN) == NODE and token_role(TOKEN) is None


def test_only_an_admin_may_stop_the_run_and_then_every_service_is_told(tmp_path):
    """``POST /run/stop``: 403 for node and trainer tokens; the admin's stop is answered at once
    to parked requests (a trainer's batch long poll and a node's lease long poll) and durable."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        with _client(svc, NODE_TOKEN) as node, _client(svc, TRAINER_TOKEN) as trainer:
            for client in (node, trainer):
                with pytest.raises(ForbiddenError, match="admin"):
                    client.stop_run()
            node_id = node.register(policies={"policy": 0}, name="n").node_id
            assert node.lease(node_id=node_id, max_tasks=1, versions={"policy": 0}).leases
            with ThreadPoolExecutor(2) as pool, _client(svc, TRAINER_TOKEN) as poller:
                parked = pool.submit(
                    poller.next_batch, policy="policy", num_groups=64, trainer_version=0,
                    wait_s=60,
                )  # fmt: skip
                with _client(svc, TOKEN) as admin:
                    assert "run stopped: maintenance" in admin.stop_run("maintenance").detail
                    assert "already" in admin.stop_run().detail
                    status = admin.status()
                reply = parked.result(timeout=10)  # answered by the stop, not by wait_s
            assert reply.done and "stopped: maintenance" in reply.reason
            assert status.stopped == "maintenance" and status.done
            grant = node.lease(node_id=node_id, max_tasks=1, versions={"policy": 0}, wait_s=30)
            assert grant.done and not grant.leases
            assert node.heartbeat(node_id, versions={"policy": 0}).stop
    # a restarted service stays stopped
    with ThreadedService(make_recipe(tmp_path), tmp_path / "df.db") as svc:
        with _client(svc, TOKEN) as admin:
            assert admin.status().stopped == "maintenance"
