"""The dataflow API's endpoints are written once (``astraflow/protocol/routes.py``): the client's
requests and the docs' tables come from that table. (The server's routes and access rules are
checked against it in ``tests/dataflow/test_routes.py`` and ``tests/dataflow/test_roles.py``.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from astraflow.protocol import PartialEpisode, Trajectory, routes
from astraflow.protocol.client import RequestRejected, SyncDataflowClient, _call

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"


@pytest.mark.parametrize("part", sorted(routes.MARKERS))
def test_the_docs_tables_are_generated_from_the_endpoint_table(part):
    """Fails when an endpoint changed and the docs did not: run
    ``python -m astraflow.protocol.routes --update docs/architecture.md``."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert routes.generated_part(text, part) == routes.markdown(part)


def test_update_rewrites_a_stale_table(tmp_path):
    doc = tmp_path / "doc.md"
    begin, end = routes.MARKERS["routes"]
    roles_begin, roles_end = routes.MARKERS["roles"]
    doc.write_text(f"intro\n{roles_begin}\nold\n{roles_end}\n{begin}\n| stale |\n{end}\noutro\n")
    assert routes.update(doc) is True
    text = doc.read_text()
    assert "| stale |" not in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert "`POST /trajectories` | node |" in text
    assert routes.update(doc) is False


def _client_requests(calls) -> list[tuple[str, str]]:
    """(method, path) of each request the client sends for ``calls`` (answered 404 by a mock
    transport, which the client raises as a rejection)."""
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        return httpx.Response(404, json={"detail": "probe", "fields": []})

    client = SyncDataflowClient("http://127.0.0.1:9", "token", retries=0)
    client._http.close()
    client._http = httpx.Client(
        base_url=client.base_url, headers=client.headers, transport=httpx.MockTransport(answer)
    )
    with client:
        for call in calls:
            with pytest.raises(RequestRejected):
                call(client)
    return seen


def test_the_client_sends_each_endpoint_its_method_and_path():
    wv = {"policy": "p", "version": 1, "location": "x", "digest": "d"}
    traj = Trajectory(
        role="a", tokens=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0], versions=[-1, 0]
    )
    part = PartialEpisode(index=0, turns=1, trajectories=[traj])
    calls = {
        routes.HEALTHZ: lambda c: c.healthz(),
        routes.REGISTER: lambda c: c.register(policies={"p": 0}),
        routes.HEARTBEAT: lambda c: c.heartbeat("n1"),
        routes.DEREGISTER: lambda c: c.deregister("n1"),
        routes.LEASE: lambda c: c.lease(node_id="n1", max_tasks=1, versions={"p": 0}),
        routes.RELEASE: lambda c: c.release("n1", ["l1"]),
        routes.PUSH: lambda c: c.push(node_id="n1", lease_id="l1", episodes=[]),
        routes.PARTIALS: lambda c: c.save_partials(node_id="n1", lease_id="l1", partials=[part]),
        routes.NEXT_BATCH: lambda c: c.next_batch(
            policy="p", num_groups=1, trainer_id="t", trainer_version=0
        ),
        routes.ACK: lambda c: c.ack("b1", trainer_version=1),
        routes.ANNOUNCE: lambda c: c.announce_version(**wv),
        routes.LATEST_VERSIONS: lambda c: c.latest_versions(),
        routes.REQUEST_EVALUATION: lambda c: c.request_evaluation(policy="p", version=0),
        routes.LIST_EVALUATIONS: lambda c: c.evaluations(),
        routes.GET_EVALUATION: lambda c: c.evaluation("e1"),
        routes.STATUS: lambda c: c.status(),
        routes.TRANSCRIPTS: lambda c: c.transcripts(),
        routes.AUTH_VERIFIERS: lambda c: c.auth_verifiers(),
        routes.RUN_STOP: lambda c: c.stop_run(),
        routes.RECIPE: lambda c: c.recipe(),
    }
    assert set(calls) == set(routes.ENDPOINTS)  # the client covers every endpoint
    ids = {"node_id": "n1", "batch_id": "b1", "eval_id": "e1"}
    expected = [(ep.method, ep.url(**{p: ids[p] for p in ep.path_params})) for ep in calls]
    assert _client_requests(calls.values()) == expected


def test_a_long_poll_adds_its_wait_to_the_timeout_and_only_a_long_poll_may():
    req = routes.NEXT_BATCH.request(
        policy="p", num_groups=1, trainer_id="t", trainer_version=0, wait_s=7.5
    )
    assert _call(routes.NEXT_BATCH, req, wait=req.wait_s).extra_timeout == 7.5
    with pytest.raises(ValueError, match="not a long poll"):
        _call(routes.ACK, None, wait=1.0, batch_id="b")


def test_access_rules_come_from_the_endpoints_and_disagreeing_roles_are_refused(monkeypatch):
    rules = dict(routes.access_rules())
    assert rules["/evaluations"] == frozenset({"trainer"})  # POST and GET share one rule
    assert "/healthz" not in rules and routes.open_paths() == {"/healthz"}
    assert all(rules[p] == routes.ANY_ROLE for p in routes.API_DOC_PATHS)
    clash = routes.Endpoint("GET", "/leases", None, None, frozenset({"trainer"}), "a clash")
    monkeypatch.setattr(routes, "ENDPOINTS", (*routes.ENDPOINTS, clash))
    with pytest.raises(ValueError, match="/leases allow different roles"):
        routes.access_rules()
