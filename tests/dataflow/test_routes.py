"""One route table builds both the FastAPI app and the raw-ASGI fast path: the same request must
get the same status and body from either, and every route exists in FastAPI."""

from __future__ import annotations

import httpx
import msgpack
import pytest
from astraflow.tasks.catalog import load_task_set
from dataflow_helpers import TOKEN, ThreadedService, make_recipe

from astraflow.dataflow.http.app import create_app
from astraflow.dataflow.http.routes import ROUTES, Route
from astraflow.protocol import routes as api

MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routes")
    with ThreadedService(make_recipe(tmp), tmp / "df.db") as svc:
        yield svc


def _post(service, path, body, accept):
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": MSGPACK, "accept": accept}
    r = httpx.post(service.url + path, content=body, headers=headers)
    data = msgpack.unpackb(r.content) if accept == MSGPACK else r.json()
    return r.status_code, data


def test_app_serves_exactly_the_route_table(tmp_path):
    app = create_app(make_recipe(tmp_path), tmp_path / "df.db", TOKEN, task_source=load_task_set)
    served = {
        (method, route.path)
        for route in app.routes
        for method in getattr(route, "methods", ()) or ()
        if method != "HEAD" and route.path in {r.path for r in ROUTES}
    }
    assert served == {(r.method, r.path) for r in ROUTES}
    assert {r.path for r in ROUTES if r.fast} == {
        "/trajectories",
        "/leases",
        "/nodes/{node_id}/heartbeat",
    }


@pytest.mark.parametrize(
    "path, body",
    [
        ("/leases", msgpack.packb({"node_id": "nobody", "max_tasks": 1})),  # 404 unknown node
        ("/leases", msgpack.packb({"node_id": "n", "max_tasks": "many"})),  # 422 names the field
        ("/nodes/nobody/heartbeat", msgpack.packb({})),  # 404 unknown node
        ("/trajectories", b"\xc1"),  # 422 not msgpack
        ("/trajectories", b""),  # 422 missing fields
        ("/nodes/nobody/heartbeat", b""),  # an empty body is an empty object on both paths
    ],
)
def test_fast_path_answers_like_fastapi(service, path, body):
    """msgpack both ways takes the fast path; a JSON Accept goes through FastAPI."""
    fast_status, fast_body = _post(service, path, body, MSGPACK)
    slow_status, slow_body = _post(service, path, body, "application/json")
    assert fast_status == slow_status and fast_status >= 400
    assert fast_body == slow_body


def test_fast_path_serves_a_registered_node(service):
    headers = {"authorization": f"Bearer {TOKEN}"}
    node = httpx.post(
        f"{service.url}/nodes/register",
        json={"policies": {"policy": 0}, "name": "n"},
        headers=headers,
    ).json()["node_id"]
    fast = _post(service, f"/nodes/{node}/heartbeat", msgpack.packb({}), MSGPACK)
    slow = _post(service, f"/nodes/{node}/heartbeat", msgpack.packb({}), "application/json")
    assert fast[0] == slow[0] == 200
    assert fast[1].keys() == slow[1].keys()


def test_each_endpoint_of_the_protocol_table_is_bound_to_one_route():
    """The server's routes are the protocol's endpoints (``astraflow/protocol/routes.py``) with
    handlers: none missing, none extra, none twice."""
    assert [r.endpoint for r in ROUTES] == list(api.ENDPOINTS)


def test_a_route_whose_query_differs_from_its_endpoint_is_refused():
    with pytest.raises(ValueError, match="query parameters"):
        Route(api.STATUS, ROUTES[0].handler)
