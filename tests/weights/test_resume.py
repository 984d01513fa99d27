"""An interrupted download resumes with a Range request instead of starting over.

A real TCP relay (``tcp_relay.TcpRelay``) sits between the client and the real weight server and cuts the first response
after a fixed number of bytes, the way a dropped cross-region connection would.
"""

from __future__ import annotations

import torch
from tcp_relay import TcpRelay

from astraflow.weights import WeightClient, WeightStore, state_digest
from astraflow.weights.server import create_weight_app, serve_in_thread

TOKEN = "resume-token"


def test_cut_download_resumes_with_range(tmp_path):
    store = WeightStore(tmp_path)
    state = {"w": torch.randn(512, 512, generator=torch.Generator().manual_seed(0))}
    store.publish("p", 0, state)
    url, stop = serve_in_thread(create_weight_app(store, TOKEN))
    port = int(url.rsplit(":", 1)[1])
    relay = TcpRelay(("127.0.0.1", port), cut_after=300_000)
    try:
        with WeightClient(f"http://127.0.0.1:{relay.port}", TOKEN, backoff=0.01) as client:
            # the meta request goes first over the same (first) connection and is small
            update = client.fetch_update("p", None, None)
        assert state_digest(update.full) == state_digest(state)
        heads = b"".join(relay.requests)
        assert b"Range: bytes=" in heads or b"range: bytes=" in heads
        assert relay.connections >= 2
    finally:
        relay.close()
        stop()


def test_a_transfer_cut_more_often_than_the_retry_budget_still_completes(tmp_path):
    """Each resumed request that brings bytes resets the retry count: a lossy link that cuts a
    large transfer many times slows it down but does not fail it."""
    store = WeightStore(tmp_path)
    state = {"w": torch.randn(512, 512, generator=torch.Generator().manual_seed(1))}
    store.publish("p", 0, state)
    size = store.meta("p", 0)["full_bytes"]
    url, stop = serve_in_thread(create_weight_app(store, TOKEN))
    port = int(url.rsplit(":", 1)[1])
    relay = TcpRelay(("127.0.0.1", port), cut_after=120_000, cut_every=True)
    try:
        with WeightClient(
            f"http://127.0.0.1:{relay.port}", TOKEN, backoff=0.01, retries=2
        ) as client:
            meta = client.meta("p", 0)
            full = client.fetch_full("p", 0, meta)
        assert state_digest(full) == state_digest(state)
        # more cut connections than the retry budget, each resumed where the last one broke
        assert relay.connections >= size // 120_000 > 2 + 1
        ranges = b"".join(relay.requests).lower().count(b"range: bytes=")
        assert ranges >= size // 120_000
    finally:
        relay.close()
        stop()
