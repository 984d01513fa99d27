"""Weight server over real loopback HTTP (uvicorn in a thread) with the real client."""

from __future__ import annotations

import httpx
import pytest
import torch

from astraflow.weights import WeightClient, WeightStore, WeightTransferError, state_digest
from astraflow.weights.server import (
    DIGEST_HEADER,
    SHA256_HEADER,
    create_weight_app,
    serve_in_thread,
)

TOKEN = "t0ken-for-tests"


@pytest.fixture
def served(tmp_path):
    store = WeightStore(tmp_path)
    g = torch.Generator().manual_seed(1)
    states = [{"w": torch.randn(300, 200, generator=g).to(torch.bfloat16), "b": torch.zeros(7)}]
    for _ in range(3):
        prev = states[-1]
        states.append(
            {
                "w": (prev["w"].float() + 1e-3 * torch.randn(300, 200, generator=g)).to(
                    torch.bfloat16
                ),
                "b": prev["b"] + 1,
            }
        )
    for v, s in enumerate(states):
        store.publish("solver", v, s)
    url, stop = serve_in_thread(create_weight_app(store, TOKEN))
    yield url, store, states
    stop()


def _bits(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].view(-1).view(torch.uint8), b[k].view(-1).view(torch.uint8))


def test_healthz_is_open_and_everything_else_needs_the_token(served):
    url, _, _ = served
    assert httpx.get(f"{url}/healthz").status_code == 200
    for path in ("/weights/solver/latest", "/weights/solver/1/full", "/weights/solver/1/delta"):
        assert httpx.get(url + path).status_code == 401
        assert httpx.get(url + path, headers={"Authorization": "Bearer nope"}).status_code == 401
    with pytest.raises(WeightTransferError, match="token"):
        WeightClient(url, "wrong", retries=0).fetch_update("solver", None, None)


def test_full_and_delta_fetch_over_http(served):
    url, _, states = served
    with WeightClient(url, TOKEN) as client:
        full = client.fetch_update("solver", None, None)
        assert full.version == 3 and full.delta is None
        _bits(full.full, states[3])
        upd = client.fetch_update("solver", 1, state_digest(states[1]))
        assert upd.full is None and upd.parent == 1 and upd.digest == state_digest(states[3])
        held = {k: v.clone() for k, v in states[1].items()}
        upd.delta.apply_(held)
        _bits(held, states[3])
        one = client.fetch_update("solver", 2, state_digest(states[2]), want_version=3)
        assert len(one.delta.deltas) == 1


def test_range_requests_and_headers(served):
    url, store, _ = served
    auth = {"Authorization": f"Bearer {TOKEN}"}
    whole = httpx.get(f"{url}/weights/solver/2/full", headers=auth)
    assert whole.status_code == 200
    assert whole.content == store.read_full("solver", 2)
    assert whole.headers[DIGEST_HEADER] == store.meta("solver", 2)["digest"]
    assert whole.headers[SHA256_HEADER] == store.meta("solver", 2)["full_sha256"]
    part = httpx.get(f"{url}/weights/solver/2/full", headers={**auth, "Range": "bytes=100-"})
    assert part.status_code == 206 and part.content == whole.content[100:]
    assert httpx.get(f"{url}/weights/solver/0/delta", headers=auth).status_code == 404
    assert httpx.get(f"{url}/weights/solver/9/full", headers=auth).status_code == 404
    assert httpx.get(f"{url}/weights/nobody/latest", headers=auth).status_code == 404


def test_corrupted_file_on_server_is_rejected_by_client(served):
    url, store, states = served
    path = store.full_path("solver", 3)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with (
        WeightClient(url, TOKEN, retries=0) as client,
        pytest.raises(WeightTransferError, match="corrupt"),
    ):
        client.fetch_update("solver", None, None)
    path.write_bytes(bytes(data[:-4]))
    with WeightClient(url, TOKEN, retries=0) as client, pytest.raises(WeightTransferError):
        client.fetch_update("solver", None, None)


def test_client_gives_up_after_retries_when_server_is_down(tmp_path):
    store = WeightStore(tmp_path)
    store.publish("p", 0, {"w": torch.arange(10, dtype=torch.float32)})
    app = create_weight_app(store, TOKEN)
    url, stop = serve_in_thread(app)
    stop()
    with (
        WeightClient(url, TOKEN, retries=1, backoff=0.01) as client,
        pytest.raises(WeightTransferError, match="retries"),
    ):
        client.fetch_update("p", None, None)
